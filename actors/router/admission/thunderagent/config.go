package thunderagent

import (
	"math"
	"time"

	"github.com/tlgw/tlgw/actors/router/admission"
)

// Config configures the thunderagent policy (SPEC R15.1; COLD-POOL.md §5). ParseConfig
// validates it.
type Config struct {
	// PauseThreshold: a worker whose programs use more than this share of its KV capacity
	// has programs paused until it is at PauseTarget.
	PauseThreshold float64
	PauseTarget    float64
	// ResumeHysteresis: paused programs are resumed onto workers up to PauseThreshold minus
	// this share only, so a resumed program does not push its worker straight back over.
	ResumeHysteresis float64
	// ResumeTimeout: a program paused this long is resumed on the roomiest worker, room or not.
	ResumeTimeout time.Duration
	// SessionRetention: an acting program (between turns) whose next turn does not come
	// within this long is forgotten, and its tokens stop counting.
	SessionRetention time.Duration
	// ActingTokenWeight scales an acting program's tokens in the pause-side usage.
	ActingTokenWeight float64
	// ActingDecayTau: on the resume side, an acting program's tokens count 2^(−idle/τ).
	ActingDecayTau time.Duration
	// BufferPerProgram is the tokens a running turn is expected to add (its output).
	BufferPerProgram int
	// MaxTrackedRequests bounds the requests tracked at once, and the programs kept.
	MaxTrackedRequests int
}

// DefaultConfig is upstream's defaults (the schema's).
func DefaultConfig() Config {
	return Config{PauseThreshold: 0.95, PauseTarget: 0.80, ResumeHysteresis: 0.10,
		ResumeTimeout: 30 * time.Minute, SessionRetention: 30 * time.Minute,
		ActingTokenWeight: 1.0, ActingDecayTau: time.Second, BufferPerProgram: 100,
		MaxTrackedRequests: 10000}
}

// ParseConfig reads the thunderagent keys of [admission] classifier (raw: the table without
// type) over DefaultConfig, with upstream's validation:
//
//	pause_threshold, pause_target, resume_hysteresis   fractions in [0, 1]; the last two ≤ pause_threshold
//	resume_timeout, session_retention, acting_decay_tau  durations > 0
//	acting_token_weight                                  a finite number > 0
//	buffer_per_program                                   integer >= 0
//	max_tracked_requests                                 integer >= 1
//
// Every other key is "unknown key".
func ParseConfig(raw map[string]any) (Config, error) {
	c := DefaultConfig()
	o := admission.NewOptions(raw)
	o.Float("pause_threshold", &c.PauseThreshold, 0, 1)
	o.Float("pause_target", &c.PauseTarget, 0, 1)
	o.Float("resume_hysteresis", &c.ResumeHysteresis, 0, 1)
	o.Duration("resume_timeout", &c.ResumeTimeout, false)
	o.Duration("session_retention", &c.SessionRetention, false)
	o.Float("acting_token_weight", &c.ActingTokenWeight, 0, math.MaxFloat64)
	o.Duration("acting_decay_tau", &c.ActingDecayTau, false)
	o.Int("buffer_per_program", &c.BufferPerProgram, 0)
	o.Int("max_tracked_requests", &c.MaxTrackedRequests, 1)
	if c.ActingTokenWeight <= 0 {
		o.Fail("acting_token_weight", "must be > 0")
	}
	if c.PauseTarget > c.PauseThreshold {
		o.Fail("pause_target", "must be <= pause_threshold (%g)", c.PauseThreshold)
	}
	if c.ResumeHysteresis > c.PauseThreshold {
		o.Fail("resume_hysteresis", "must be <= pause_threshold (%g)", c.PauseThreshold)
	}
	return c, o.Err()
}

// Factory is the thunderagent classifier's admission.Factory.
func Factory(raw map[string]any, env admission.Env) (admission.Policy, error) {
	c, err := ParseConfig(raw)
	if err != nil {
		return nil, err
	}
	now := env.Now
	if now == nil {
		now = time.Now
	}
	return New(c, now), nil
}
