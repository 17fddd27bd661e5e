// Package rollout is a route's progressive rollout (SPEC R25): the canary's share of the route
// goes up a list of steps, one step an interval, for as long as the canary's window figures hold
// against the baseline's, and back to 0% the first window they do not. It is pure: the caller
// (the router) counts each backend's requests, errors and TTFT per window, and calls Decide at
// the end of each window on its injected clock; everything here is a function of what it is
// given, so every decision is testable exactly.
package rollout

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/tlgw/tlgw/internal/history"
)

// Spec is a route's rollout = { canary, baseline, steps, step_interval, min_requests,
// max_error_ratio, max_ttft_p99_ratio, max_error_rate }.
type Spec struct {
	Canary   string    // the new backend model
	Baseline string    // the backend it is judged against
	Steps    []float64 // the canary's share in percent at each step, increasing, the last 100
	Interval time.Duration
	// MinRequests is the fewest canary requests in a window for a verdict on ratios; with
	// fewer the window holds (unless the absolute error rate is already lost, see Decide).
	MinRequests uint64
	// MaxErrorRatio bounds the canary's error rate over the baseline's; MaxTTFTP99Ratio its
	// TTFT p99 over the baseline's; MaxErrorRate its error rate alone.
	MaxErrorRatio   float64
	MaxTTFTP99Ratio float64
	MaxErrorRate    float64
}

// Defaults of a rollout's optional fields (SPEC R25's example).
var (
	DefaultSteps    = []float64{1, 5, 25, 50, 100}
	DefaultInterval = 5 * time.Minute
)

const (
	DefaultMinRequests     = 200
	DefaultMaxErrorRatio   = 1.5
	DefaultMaxTTFTP99Ratio = 1.25
	DefaultMaxErrorRate    = 0.05

	// MaxSteps bounds a rollout's steps; MinInterval and MaxInterval its step interval.
	MaxSteps    = 32
	MinInterval = time.Second
	MaxInterval = 24 * time.Hour
	// MaxHistory bounds the decisions a rollout keeps (the newest).
	MaxHistory = 64
	// MinRatioErrors is the fewest canary errors in a window for the error-ratio rule: with a
	// handful of errors among hundreds of requests a ratio is noise (one error against a
	// baseline's none is an infinite ratio). The absolute rate needs no such floor.
	MinRatioErrors = 5
	// MinTTFTExcess is the least a canary's TTFT p99 must exceed the baseline's by, beyond the
	// ratio, to roll back: at millisecond TTFTs a few observations' jitter (and the histogram's
	// doubling buckets) make ratios of 1.5–2× between identical engines; no operator rolls back
	// for a millisecond.
	MinTTFTExcess = 25 * time.Millisecond
)

// Validate checks the spec; nil or the first problem, naming the field.
func (s Spec) Validate() error {
	switch {
	case s.Canary == "":
		return errors.New("canary: must name the new backend model")
	case s.Baseline == "":
		return errors.New("baseline: must name the backend the canary is judged against")
	case s.Canary == s.Baseline:
		return errors.New("canary: must differ from baseline")
	case len(s.Steps) == 0 || len(s.Steps) > MaxSteps:
		return fmt.Errorf("steps: 1 to %d shares in percent", MaxSteps)
	case s.Interval < MinInterval || s.Interval > MaxInterval:
		return fmt.Errorf("step_interval: %v is not between %v and %v", s.Interval, MinInterval, MaxInterval)
	case s.MinRequests < 1:
		return errors.New("min_requests: at least 1")
	case !(s.MaxErrorRatio >= 1) || math.IsInf(s.MaxErrorRatio, 0):
		return errors.New("max_error_ratio: a finite ratio of at least 1")
	case !(s.MaxTTFTP99Ratio >= 1) || math.IsInf(s.MaxTTFTP99Ratio, 0):
		return errors.New("max_ttft_p99_ratio: a finite ratio of at least 1")
	case !(s.MaxErrorRate >= 0 && s.MaxErrorRate <= 1):
		return errors.New("max_error_rate: a share between 0 and 1")
	}
	prev := 0.0
	for i, p := range s.Steps {
		if !(p > prev && p <= 100) {
			return fmt.Errorf("steps[%d]: %v must be above the step before (%v) and at most 100", i, p, prev)
		}
		prev = p
	}
	if prev != 100 {
		return errors.New("steps: the last step must be 100")
	}
	return nil
}

// Counts are one backend's figures over a window: requests ended, those that failed (5xx,
// interrupted streams, timeouts; a 4xx is the client's), and the time to first byte as
// cumulative histogram buckets (upper bound in seconds → count, +Inf included).
type Counts struct {
	Requests, Errors uint64
	TTFT             map[float64]uint64
}

// Figures are what a decision saw of one backend.
type Figures struct {
	Requests  uint64  `json:"requests"`
	Errors    uint64  `json:"errors"`
	ErrorRate float64 `json:"error_rate"`
	// TTFTP99Ms is the window's TTFT p99 in milliseconds; -1: no observation.
	TTFTP99Ms float64 `json:"ttft_p99_ms"`
}

func figures(c Counts) Figures {
	f := Figures{Requests: c.Requests, Errors: min(c.Errors, c.Requests), TTFTP99Ms: -1}
	if c.Requests > 0 {
		f.ErrorRate = float64(f.Errors) / float64(c.Requests)
	}
	if p, ok := history.Quantile(0.99, c.TTFT); ok {
		f.TTFTP99Ms = p * 1000
	}
	return f
}

// Decisions, as tlgw_rollout_decisions_total names them, and the operator's other actions kept
// in the history.
const (
	Advance  = "advance"
	Hold     = "hold"
	Rollback = "rollback"
	Promote  = "promote"
	Abort    = "abort"
	Pause    = "pause"
	Resume   = "resume"
)

// Status is where a rollout is.
type Status string

const (
	Running    Status = "running"
	Paused     Status = "paused"
	Completed  Status = "completed"   // promoted: the canary has 100%, nothing more is decided
	RolledBack Status = "rolled_back" // a window failed: the canary has 0%, stopped
	Aborted    Status = "aborted"     // the operator stopped it: 0%
)

// Ended reports whether nothing more happens to a rollout in status s.
func (s Status) Ended() bool { return s == Completed || s == RolledBack || s == Aborted }

// Record is one decision or action, with what it saw.
type Record struct {
	At       time.Time `json:"at"`
	Decision string    `json:"decision"`
	Reason   string    `json:"reason,omitempty"`
	From     float64   `json:"from_percent"`
	To       float64   `json:"to_percent"`
	Canary   *Figures  `json:"canary,omitempty"`
	Baseline *Figures  `json:"baseline,omitempty"`
}

// State is a rollout's progress: the step, the status, when the current window began, and the
// newest MaxHistory records. Its JSON form is what the admin API shows and etcd stores.
type State struct {
	Step        int       `json:"step"` // index into Spec.Steps
	Status      Status    `json:"status"`
	WindowStart time.Time `json:"window_start"`
	History     []Record  `json:"history"` // oldest first; at most MaxHistory
}

// Start is a new rollout at its first step, its first window beginning now.
func Start(now time.Time) State { return State{Status: Running, WindowStart: now} }

// Percent is the canary's share of the route now.
func (s *State) Percent(spec Spec) float64 {
	switch {
	case s.Status == Completed:
		return 100
	case s.Status == RolledBack || s.Status == Aborted:
		return 0
	case s.Step >= 0 && s.Step < len(spec.Steps):
		return spec.Steps[s.Step]
	}
	return 0
}

// Due reports whether the current window has ended: a running rollout's verdict is owed.
func (s *State) Due(spec Spec, now time.Time) bool {
	return s.Status == Running && !now.Before(s.WindowStart.Add(spec.Interval))
}

// Decide judges the window that just ended (Due) from the canary's and the baseline's counts in
// it, applies the decision and returns its record; the caller starts new counts. In order:
//   - rollback, error_rate: the canary's error rate is over max_error_rate — with fewer than
//     min_requests too, once its errors alone put it over even had the rest of min_requests
//     succeeded (errors > max_error_rate × min_requests);
//   - hold: fewer than min_requests canary requests;
//   - rollback, error_ratio: the canary's error rate over max_error_ratio × the baseline's, with
//     at least MinRatioErrors canary errors, and the baseline at min_requests or more;
//   - rollback, ttft_p99: the canary's TTFT p99 over max_ttft_p99_ratio × the baseline's and
//     by MinTTFTExcess or more, both with observations and the baseline at min_requests or more;
//   - advance to the next step, or promote after the last (100%).
func (s *State) Decide(spec Spec, now time.Time, canary, baseline Counts) Record {
	c, b := figures(canary), figures(baseline)
	rec := Record{At: now, From: s.Percent(spec), Canary: &c, Baseline: &b}
	baselineJudged := b.Requests >= spec.MinRequests
	switch {
	case c.Requests >= spec.MinRequests && c.ErrorRate > spec.MaxErrorRate,
		c.Requests < spec.MinRequests && float64(c.Errors) > spec.MaxErrorRate*float64(spec.MinRequests):
		rec.Decision, rec.Reason = Rollback, fmt.Sprintf("error_rate: %.4f over %.4f", c.ErrorRate, spec.MaxErrorRate)
	case c.Requests < spec.MinRequests:
		rec.Decision, rec.Reason = Hold, fmt.Sprintf("%d canary requests, fewer than %d", c.Requests, spec.MinRequests)
	case baselineJudged && c.Errors >= MinRatioErrors && c.ErrorRate > spec.MaxErrorRatio*b.ErrorRate:
		rec.Decision, rec.Reason = Rollback, fmt.Sprintf("error_ratio: %.4f against the baseline's %.4f (at most %.2f×)",
			c.ErrorRate, b.ErrorRate, spec.MaxErrorRatio)
	case baselineJudged && c.TTFTP99Ms >= 0 && b.TTFTP99Ms > 0 && c.TTFTP99Ms > spec.MaxTTFTP99Ratio*b.TTFTP99Ms &&
		c.TTFTP99Ms-b.TTFTP99Ms >= float64(MinTTFTExcess)/float64(time.Millisecond):
		rec.Decision, rec.Reason = Rollback, fmt.Sprintf("ttft_p99: %.1f ms against the baseline's %.1f ms (at most %.2f×)",
			c.TTFTP99Ms, b.TTFTP99Ms, spec.MaxTTFTP99Ratio)
	case s.Step+1 >= len(spec.Steps):
		rec.Decision = Promote
	default:
		rec.Decision = Advance
	}
	switch rec.Decision {
	case Rollback:
		s.Status = RolledBack
	case Promote:
		s.Status = Completed
	case Advance:
		s.Step++
	}
	s.WindowStart = now
	rec.To = s.Percent(spec)
	s.note(rec)
	return rec
}

// ErrEnded: the action needs a rollout that has not ended.
var ErrEnded = errors.New("the rollout has ended")

// Act applies an operator's action (Pause, Resume, Promote, Abort) at now and returns its
// record. Pause holds the split where it is and decides nothing; Resume starts a new window at
// now; Promote gives the canary 100% and ends the rollout; Abort gives it 0% and ends it. An
// ended rollout takes no action; pausing a paused one or resuming a running one is no error
// and records nothing.
func (s *State) Act(spec Spec, action string, now time.Time) (Record, bool, error) {
	if s.Status.Ended() {
		return Record{}, false, ErrEnded
	}
	rec := Record{At: now, Decision: action, From: s.Percent(spec)}
	switch action {
	case Pause:
		if s.Status == Paused {
			return Record{}, false, nil
		}
		s.Status = Paused
	case Resume:
		if s.Status == Running {
			return Record{}, false, nil
		}
		s.Status, s.WindowStart = Running, now
	case Promote:
		s.Status = Completed
	case Abort:
		s.Status = Aborted
	default:
		return Record{}, false, fmt.Errorf("unknown action %q (pause, resume, promote, abort)", action)
	}
	rec.Reason = "operator"
	rec.To = s.Percent(spec)
	s.note(rec)
	return rec, true, nil
}

// note keeps rec, the oldest going past MaxHistory.
func (s *State) note(rec Record) {
	if len(s.History) >= MaxHistory {
		s.History = append(s.History[:0], s.History[len(s.History)-MaxHistory+1:]...)
	}
	s.History = append(s.History, rec)
}
