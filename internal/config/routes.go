package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tlgw/tlgw/internal/cascade"
	"github.com/tlgw/tlgw/internal/rollout"
)

// Route targets: where a route's requests run (R8).
const (
	TargetUnified       = "unified"
	TargetDisaggregated = "disaggregated"
)

// Route is one public model id of the route table and how its requests are
// served (R5, R7, R8). The JSON form is the one the admin API speaks.
//
// Backends and Cascade tell "absent" from "explicitly empty" by nil-ness: a
// nil slice means the field was not given (JSON absent or null), a non-nil
// empty slice means it was given as [] — which ValidateRoutes rejects.
// Targets works the same way; NormalizeRoutes fills an absent one.
type Route struct {
	Model    string        `json:"model"`
	Aliases  []string      `json:"aliases,omitempty"`
	Backends []Backend     `json:"backends,omitempty"`
	Cascade  []CascadeStep `json:"cascade,omitempty"`
	Targets  []string      `json:"targets,omitempty"`
	// PDProtocol is how a disaggregated route's prefill and decode workers are driven (R22):
	// PDTL (our EngineControl/Prefill, KV push and release), PDVLLM (vLLM's two HTTP calls
	// with kv_transfer_params) or PDSGLang (SGLang's bootstrap room, both at once). "" is
	// PDTL; any value on a route that is not disaggregated is refused.
	PDProtocol string `json:"pd_protocol,omitempty"`
	// Rollout moves the route's split from its baseline to its canary step by step, judged
	// on each step's window (R25); nil: the backends' weights stand.
	Rollout *Rollout `json:"rollout,omitempty"`
}

// Rollout is a route's rollout = { canary, baseline, steps, step_interval, min_requests,
// max_error_ratio, max_ttft_p99_ratio, max_error_rate } (R25). A field left out takes its
// default (NormalizeRoutes fills them in: what the admin API shows is what runs). The route's
// backends are the baseline and the canary — given, or left out and implied — and the canary's
// share of them is the current step's, whatever their weights say.
type Rollout struct {
	Canary          string    `json:"canary"`
	Baseline        string    `json:"baseline"`
	Steps           []float64 `json:"steps,omitempty"`
	StepInterval    Duration  `json:"step_interval,omitempty"`
	MinRequests     uint64    `json:"min_requests,omitempty"`
	MaxErrorRatio   float64   `json:"max_error_ratio,omitempty"`
	MaxTTFTP99Ratio float64   `json:"max_ttft_p99_ratio,omitempty"`
	// MaxErrorRate is a pointer: 0 (no error allowed) is a value, not "left out".
	MaxErrorRate *float64 `json:"max_error_rate,omitempty"`
}

// withDefaults is r with every left-out field at its default.
func (r Rollout) withDefaults() Rollout {
	out := r
	out.Steps = slices.Clone(r.Steps)
	if out.Steps == nil {
		out.Steps = slices.Clone(rollout.DefaultSteps)
	}
	if out.StepInterval == 0 {
		out.StepInterval = Duration(rollout.DefaultInterval)
	}
	if out.MinRequests == 0 {
		out.MinRequests = rollout.DefaultMinRequests
	}
	if out.MaxErrorRatio == 0 {
		out.MaxErrorRatio = rollout.DefaultMaxErrorRatio
	}
	if out.MaxTTFTP99Ratio == 0 {
		out.MaxTTFTP99Ratio = rollout.DefaultMaxTTFTP99Ratio
	}
	rate := float64(rollout.DefaultMaxErrorRate)
	if r.MaxErrorRate != nil {
		rate = *r.MaxErrorRate
	}
	out.MaxErrorRate = &rate
	return out
}

// Spec is the rollout as the judge takes it, defaults filled in.
func (r Rollout) Spec() rollout.Spec {
	d := r.withDefaults()
	return rollout.Spec{Canary: d.Canary, Baseline: d.Baseline, Steps: d.Steps, Interval: time.Duration(d.StepInterval),
		MinRequests: d.MinRequests, MaxErrorRatio: d.MaxErrorRatio, MaxTTFTP99Ratio: d.MaxTTFTP99Ratio, MaxErrorRate: *d.MaxErrorRate}
}

// The disaggregation protocols of a route's pd_protocol (R22).
const (
	PDTL     = "tl"
	PDVLLM   = "vllm"
	PDSGLang = "sglang"
)

// PD is the route's disaggregation protocol with the default filled in (PDTL).
func (r Route) PD() string {
	if r.PDProtocol == "" {
		return PDTL
	}
	return r.PDProtocol
}

// Backend is one branch of a route's weighted split. A weight left out
// (in TOML or JSON) is 1.
type Backend struct {
	Model  string  `json:"model"`
	Weight float64 `json:"weight"`
}

// UnmarshalJSON decodes a backend, defaulting an absent weight to 1 and
// rejecting unknown fields, so JSON routes mean what the same TOML means.
func (b *Backend) UnmarshalJSON(data []byte) error {
	if string(bytes.TrimSpace(data)) == "null" {
		return nil
	}
	var raw struct {
		Model  string   `json:"model"`
		Weight *float64 `json:"weight"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&raw); err != nil {
		return err
	}
	b.Model, b.Weight = raw.Model, 1
	if raw.Weight != nil {
		b.Weight = *raw.Weight
	}
	return nil
}

// CascadeStep is one step of a cascade: the model asked, and when its answer
// is kept (see cascade.ParseAcceptIf). The last step has no AcceptIf.
type CascadeStep struct {
	Model    string `json:"model"`
	AcceptIf string `json:"accept_if,omitempty"`
}

// ValidateRoutes checks a whole route table: every public id (route model
// or alias) non-empty and unique across the table; at most one of backends
// and cascade per route, and neither given as an empty list; backend models
// non-empty, weights finite and >= 0 with a positive sum; cascade step
// models non-empty, every step but the last with an accept_if that
// cascade.ParseAcceptIf accepts, the last step without one; targets absent
// or exactly one of "unified" and "disaggregated".
//
// It returns nil or an *Error whose problem paths are relative to the list,
// e.g. "routes[2].cascade[0].accept_if".
func ValidateRoutes(routes []Route) error {
	var ps problems
	validateRoutes(routes, nil, &ps)
	if ps.empty() {
		return nil
	}
	return &Error{Problems: ps.sorted()}
}

// MaxRollouts bounds the routes of one table that carry a rollout (R25): what a replica keeps
// and, in a cluster, stores and exchanges for them is bounded by it.
const MaxRollouts = 64

// validateRoutes adds the problems of routes to ps, under base.routes.
func validateRoutes(routes []Route, base path, ps *problems) {
	if n := countRollouts(routes); n > MaxRollouts {
		ps.add(base.with(key("routes")), "%d routes carry a rollout, more than %d", n, MaxRollouts)
	}
	type owner struct {
		route   int
		isAlias bool
	}
	ids := make(map[string]owner)
	claim := func(id string, p path, o owner) {
		if id == "" {
			ps.add(p, "must not be empty")
			return
		}
		if prev, dup := ids[id]; dup {
			what := "the model"
			if prev.isAlias {
				what = "an alias"
			}
			ps.add(p, "%q is already %s of %s", id, what, base.with(key("routes"), index(prev.route)))
			return
		}
		ids[id] = o
	}

	for i, r := range routes {
		rp := base.with(key("routes"), index(i))
		claim(r.Model, rp.with(key("model")), owner{route: i})
		for j, a := range r.Aliases {
			claim(a, rp.with(key("aliases"), index(j)), owner{route: i, isAlias: true})
		}

		if r.Backends != nil && r.Cascade != nil {
			ps.add(rp, "backends and cascade are mutually exclusive; give at most one")
		}

		if r.Backends != nil {
			bp := rp.with(key("backends"))
			if len(r.Backends) == 0 {
				ps.add(bp, "must not be empty")
			}
			sum, weightsOK := 0.0, true
			for j, b := range r.Backends {
				if b.Model == "" {
					ps.add(bp.with(index(j), key("model")), "must not be empty")
				}
				switch w := b.Weight; {
				case math.IsNaN(w) || math.IsInf(w, 0):
					ps.add(bp.with(index(j), key("weight")), "must be a finite number")
					weightsOK = false
				case w < 0:
					ps.add(bp.with(index(j), key("weight")), "must be >= 0")
					weightsOK = false
				default:
					sum += w
				}
			}
			if len(r.Backends) > 0 && weightsOK && !(sum > 0) {
				ps.add(bp, "weights must have a positive sum")
			}
		}

		if r.Rollout != nil {
			validateRollout(r, rp.with(key("rollout")), ps)
		}

		if r.Cascade != nil {
			cp := rp.with(key("cascade"))
			if len(r.Cascade) == 0 {
				ps.add(cp, "must not be empty")
			}
			for j, s := range r.Cascade {
				sp := cp.with(index(j))
				if s.Model == "" {
					ps.add(sp.with(key("model")), "must not be empty")
				}
				last := j == len(r.Cascade)-1
				switch {
				case last && s.AcceptIf != "":
					ps.add(sp.with(key("accept_if")), "must not be set on the last step, whose answer is always kept")
				case !last && s.AcceptIf == "":
					ps.add(sp.with(key("accept_if")), "is required on every step but the last")
				case !last:
					if _, err := cascade.ParseAcceptIf(s.AcceptIf); err != nil {
						var se *cascade.SyntaxError
						if errors.As(err, &se) {
							ps.add(sp.with(key("accept_if")), "%s: %s", strconv.Quote(se.Input), se.Reason)
						} else {
							ps.add(sp.with(key("accept_if")), "%v", err)
						}
					}
				}
			}
		}

		if r.Targets != nil {
			tp := rp.with(key("targets"))
			if len(r.Targets) != 1 {
				ps.add(tp, "must have exactly one item")
			}
			for j, t := range r.Targets {
				if t != TargetUnified && t != TargetDisaggregated {
					ps.add(tp.with(index(j)), "%q is not one of %q, %q", t, TargetUnified, TargetDisaggregated)
				}
			}
		}

		if r.PDProtocol != "" {
			pp := rp.with(key("pd_protocol"))
			switch {
			case r.PDProtocol != PDTL && r.PDProtocol != PDVLLM && r.PDProtocol != PDSGLang:
				ps.add(pp, "%q is not one of %q, %q, %q", r.PDProtocol, PDTL, PDVLLM, PDSGLang)
			case len(r.Targets) != 1 || r.Targets[0] != TargetDisaggregated:
				ps.add(pp, "is only for a disaggregated route (targets = [%q])", TargetDisaggregated)
			}
		}
	}
}

// NormalizeRoutes returns a deep copy of routes with defaults filled in:
// an absent or empty Targets becomes ["unified"]. Backend weights are kept
// as given. A nil table stays nil.
func NormalizeRoutes(routes []Route) []Route {
	if routes == nil {
		return nil
	}
	out := make([]Route, len(routes))
	for i, r := range routes {
		out[i] = Route{
			Model:    r.Model,
			Aliases:  slices.Clone(r.Aliases),
			Backends: slices.Clone(r.Backends),
			Cascade:  slices.Clone(r.Cascade),
			Targets:  slices.Clone(r.Targets),
			// PDProtocol stays as given: "" reads as "tl" (Route.PD), so tables that never
			// named one look the same in the admin API as before.
			PDProtocol: r.PDProtocol,
		}
		if r.Rollout != nil {
			ro := r.Rollout.withDefaults()
			out[i].Rollout = &ro
			if out[i].Backends == nil && r.Cascade == nil {
				// Implied: the baseline and the canary (the rollout sets their shares).
				out[i].Backends = []Backend{{Model: ro.Baseline, Weight: 1}, {Model: ro.Canary, Weight: 0}}
			}
		}
		if len(out[i].Targets) == 0 {
			out[i].Targets = []string{TargetUnified}
		}
	}
	return out
}

func countRollouts(routes []Route) int {
	n := 0
	for _, r := range routes {
		if r.Rollout != nil {
			n++
		}
	}
	return n
}

// validateRollout adds the problems of route r's rollout (at rp): its spec (rollout.Spec's
// rules, under the field they name), no cascade, and backends that are the baseline and the
// canary or none.
func validateRollout(r Route, rp path, ps *problems) {
	if r.Cascade != nil {
		ps.add(rp, "a cascade route has no rollout: give backends (or none) instead")
	}
	if err := r.Rollout.Spec().Validate(); err != nil {
		field, msg, ok := strings.Cut(err.Error(), ": ")
		if f, _, _ := strings.Cut(field, "["); ok && f != "" {
			ps.add(rp.with(key(f)), "%s", msg)
		} else {
			ps.add(rp, "%v", err)
		}
	}
	if r.Backends == nil {
		return
	}
	models := make([]string, 0, len(r.Backends))
	for _, b := range r.Backends {
		models = append(models, b.Model)
	}
	slices.Sort(models)
	want := []string{r.Rollout.Baseline, r.Rollout.Canary}
	slices.Sort(want)
	if !slices.Equal(models, want) {
		ps.add(rp.with(key("baseline")), "the route's backends must be the baseline and the canary (or be left out)")
	}
}
