package rollout

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

func spec() Spec {
	return Spec{Canary: "smol-v4", Baseline: "smol-v3", Steps: []float64{1, 5, 25, 50, 100}, Interval: 5 * time.Minute,
		MinRequests: 200, MaxErrorRatio: 1.5, MaxTTFTP99Ratio: 1.25, MaxErrorRate: 0.05}
}

var t0 = time.Unix(1_700_000_000, 0)

// ttft is a histogram whose observations all took d (buckets 10 ms, 100 ms, 1 s, 10 s).
func ttft(n uint64, d time.Duration) map[float64]uint64 {
	h := map[float64]uint64{}
	for _, le := range []float64{0.01, 0.1, 1, 10, math.Inf(1)} {
		if d.Seconds() <= le {
			h[le] = n
		} else {
			h[le] = 0
		}
	}
	return h
}

// TestDecisions (R25): each rule of Decide, on the window's figures.
func TestDecisions(t *testing.T) {
	healthy := Counts{Requests: 1000, Errors: 10, TTFT: ttft(1000, 50*time.Millisecond)}
	for _, c := range []struct {
		name     string
		canary   Counts
		baseline Counts
		want     string
		reason   string
	}{
		{"healthy: advance", Counts{Requests: 300, Errors: 3, TTFT: ttft(300, 50*time.Millisecond)}, healthy, Advance, ""},
		{"too few requests: hold", Counts{Requests: 199, Errors: 0}, healthy, Hold, "199 canary requests"},
		{"too few, but already lost: rollback", Counts{Requests: 50, Errors: 11}, healthy, Rollback, "error_rate"},
		{"too few, errors at the bound: hold", Counts{Requests: 50, Errors: 10}, healthy, Hold, ""},
		{"error rate over the absolute bound", Counts{Requests: 200, Errors: 11}, Counts{Requests: 1000, Errors: 100}, Rollback, "error_rate"},
		{"error rate at the absolute bound", Counts{Requests: 200, Errors: 10}, Counts{Requests: 1000, Errors: 100}, Advance, ""},
		{"error ratio over", Counts{Requests: 1000, Errors: 16}, healthy, Rollback, "error_ratio"},
		{"error ratio at", Counts{Requests: 1000, Errors: 15}, healthy, Advance, ""},
		{"error ratio with too few errors to judge", Counts{Requests: 1000, Errors: 4}, Counts{Requests: 1000}, Advance, ""},
		{"error ratio, the baseline too small to judge", Counts{Requests: 1000, Errors: 30}, Counts{Requests: 199}, Advance, ""},
		{"ttft p99 over", Counts{Requests: 300, TTFT: ttft(300, 500*time.Millisecond)}, healthy, Rollback, "ttft_p99"},
		{"ttft p99 over the ratio by too little", Counts{Requests: 300, TTFT: ttft(300, 3*time.Millisecond)},
			Counts{Requests: 1000, TTFT: ttft(1000, 800*time.Microsecond)}, Advance, ""},
		{"ttft p99 without a baseline figure", Counts{Requests: 300, TTFT: ttft(300, 500*time.Millisecond)}, Counts{Requests: 1000}, Advance, ""},
		{"ttft p99, the baseline too small", Counts{Requests: 300, TTFT: ttft(300, 500*time.Millisecond)},
			Counts{Requests: 10, TTFT: ttft(10, 50*time.Millisecond)}, Advance, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			sp := spec()
			s := Start(t0)
			s.Step = 1
			if !s.Due(sp, t0.Add(sp.Interval)) || s.Due(sp, t0.Add(sp.Interval-1)) {
				t.Fatal("a window is due at its interval's end, not before")
			}
			end := t0.Add(sp.Interval)
			rec := s.Decide(sp, end, c.canary, c.baseline)
			if rec.Decision != c.want || !strings.Contains(rec.Reason, c.reason) {
				t.Fatalf("decision %s (%s), want %s (%s); canary %+v baseline %+v", rec.Decision, rec.Reason, c.want, c.reason, *rec.Canary, *rec.Baseline)
			}
			wantPercent := map[string]float64{Advance: 25, Hold: 5, Rollback: 0}[c.want]
			if rec.From != 5 || rec.To != wantPercent || s.Percent(sp) != wantPercent {
				t.Fatalf("%v%% → %v%% (now %v%%), want 5%% → %v%%", rec.From, rec.To, s.Percent(sp), wantPercent)
			}
			if c.want == Rollback && (s.Status != RolledBack || s.Due(sp, end.Add(time.Hour))) {
				t.Fatalf("after a rollback: %s, due %v", s.Status, s.Due(sp, end.Add(time.Hour)))
			}
			if c.want != Rollback && (s.WindowStart != end || s.Status != Running) {
				t.Fatalf("the next window starts at %v (%s), want %v", s.WindowStart, s.Status, end)
			}
			if len(s.History) != 1 || s.History[0].Decision != c.want {
				t.Fatalf("history %+v", s.History)
			}
		})
	}
}

// TestFiguresSeen: a decision records what it saw: counts, rates, p99 in milliseconds (-1:
// none); errors are never more than requests.
func TestFiguresSeen(t *testing.T) {
	sp := spec()
	s := Start(t0)
	rec := s.Decide(sp, t0.Add(sp.Interval), Counts{Requests: 400, Errors: 8, TTFT: ttft(400, 50*time.Millisecond)},
		Counts{Requests: 5, Errors: 9})
	if c := *rec.Canary; c.Requests != 400 || c.Errors != 8 || c.ErrorRate != 0.02 || math.Abs(c.TTFTP99Ms-99.1) > 0.01 {
		t.Fatalf("canary figures %+v", c)
	}
	if b := *rec.Baseline; b.Errors != 5 || b.ErrorRate != 1 || b.TTFTP99Ms != -1 {
		t.Fatalf("baseline figures %+v", b)
	}
}

// TestWholeRollout: healthy windows walk every step and promote after the last; the canary's
// share at each step is the spec's.
func TestWholeRollout(t *testing.T) {
	sp := spec()
	s := Start(t0)
	now := t0
	var shares []float64
	for range len(sp.Steps) {
		shares = append(shares, s.Percent(sp))
		now = now.Add(sp.Interval)
		s.Decide(sp, now, Counts{Requests: 500}, Counts{Requests: 500})
	}
	if s.Status != Completed || s.Percent(sp) != 100 || s.History[len(s.History)-1].Decision != Promote {
		t.Fatalf("after every step: %s at %v%%", s.Status, s.Percent(sp))
	}
	for i, p := range sp.Steps {
		if shares[i] != p {
			t.Fatalf("step %d had %v%%, want %v%%", i, shares[i], p)
		}
	}
	if s.Due(sp, now.Add(time.Hour)) {
		t.Fatal("a completed rollout is due")
	}
}

// TestActions: pause holds the split and stops the windows; resume starts a new window; promote
// and abort end the rollout at 100% and 0%; an ended rollout takes no action.
func TestActions(t *testing.T) {
	sp := spec()
	s := Start(t0)
	s.Step = 2
	if _, did, err := s.Act(sp, Pause, t0.Add(time.Minute)); err != nil || !did || s.Status != Paused || s.Percent(sp) != 25 {
		t.Fatalf("pause: %v %v %s %v%%", did, err, s.Status, s.Percent(sp))
	}
	if s.Due(sp, t0.Add(time.Hour)) {
		t.Fatal("a paused rollout is due")
	}
	if _, did, err := s.Act(sp, Pause, t0.Add(2*time.Minute)); err != nil || did {
		t.Fatal("pausing a paused rollout did something")
	}
	resumed := t0.Add(time.Hour)
	if _, did, err := s.Act(sp, Resume, resumed); err != nil || !did || s.Status != Running || s.WindowStart != resumed {
		t.Fatalf("resume: %v %v %s window %v", did, err, s.Status, s.WindowStart)
	}
	if _, did, _ := s.Act(sp, Resume, resumed); did {
		t.Fatal("resuming a running rollout did something")
	}
	if _, _, err := s.Act(sp, "faster", resumed); err == nil {
		t.Fatal("an unknown action was taken")
	}
	p := s
	p.History = append([]Record(nil), s.History...)
	if rec, _, err := p.Act(sp, Promote, resumed); err != nil || p.Status != Completed || rec.From != 25 || rec.To != 100 {
		t.Fatalf("promote: %v %s %+v", err, p.Status, rec)
	}
	if rec, _, err := s.Act(sp, Abort, resumed); err != nil || s.Status != Aborted || rec.To != 0 || s.Percent(sp) != 0 {
		t.Fatalf("abort: %v %s %+v", err, s.Status, rec)
	}
	for _, a := range []string{Pause, Resume, Promote, Abort} {
		if _, _, err := s.Act(sp, a, resumed); !errors.Is(err, ErrEnded) {
			t.Fatalf("%s on an aborted rollout: %v", a, err)
		}
	}
	if n := len(s.History); n != 3 { // pause, resume, abort (the promote was the copy's)
		t.Fatalf("%d records, want 3 on this state: %+v", n, s.History)
	}
}

func TestValidate(t *testing.T) {
	if err := spec().Validate(); err != nil {
		t.Fatal(err)
	}
	for field, mutate := range map[string]func(*Spec){
		"canary":             func(s *Spec) { s.Canary = "" },
		"baseline":           func(s *Spec) { s.Baseline = "" },
		"must differ":        func(s *Spec) { s.Baseline = s.Canary },
		"steps:":             func(s *Spec) { s.Steps = nil },
		"steps[2]":           func(s *Spec) { s.Steps = []float64{1, 5, 5, 100} },
		"steps[0]":           func(s *Spec) { s.Steps = []float64{0, 100} },
		"last step":          func(s *Spec) { s.Steps = []float64{1, 50} },
		"steps[1]":           func(s *Spec) { s.Steps = []float64{50, 101} },
		"step_interval":      func(s *Spec) { s.Interval = time.Millisecond },
		"min_requests":       func(s *Spec) { s.MinRequests = 0 },
		"max_error_ratio":    func(s *Spec) { s.MaxErrorRatio = 0.9 },
		"max_ttft_p99_ratio": func(s *Spec) { s.MaxTTFTP99Ratio = math.NaN() },
		"max_error_rate":     func(s *Spec) { s.MaxErrorRate = 1.5 },
	} {
		s := spec()
		mutate(&s)
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v", field, err)
		}
	}
	s := spec()
	s.Steps = make([]float64, MaxSteps+1)
	for i := range s.Steps {
		s.Steps[i] = float64(i+1) * 100 / float64(len(s.Steps))
	}
	if s.Validate() == nil {
		t.Error("more than MaxSteps steps accepted")
	}
	s.Steps = s.Steps[1:]
	if err := s.Validate(); err != nil {
		t.Errorf("MaxSteps steps: %v", err)
	}
}

// TestRolloutProperties (rapid): whatever the windows and actions, the canary's share is 0, a
// step's or 100; a step never goes back; an ended rollout stays as it ended and is never due;
// the history keeps the newest MaxHistory records; only a running rollout is due.
func TestRolloutProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		sp := spec()
		sp.MinRequests = uint64(rapid.IntRange(1, 50).Draw(rt, "min"))
		s := Start(t0)
		now := t0
		decisions := 0
		for i, n := 0, rapid.IntRange(1, 150).Draw(rt, "ops"); i < n; i++ {
			before, step := s.Status, s.Step
			now = now.Add(time.Duration(rapid.IntRange(0, 600).Draw(rt, "dt")) * time.Second)
			if rapid.IntRange(0, 5).Draw(rt, "kind") == 0 {
				a := rapid.SampledFrom([]string{Pause, Resume, Promote, Abort}).Draw(rt, "action")
				_, did, err := s.Act(sp, a, now)
				if before.Ended() && (err == nil || did) {
					rt.Fatalf("%s on an ended rollout", a)
				}
				decisions += map[bool]int{true: 1}[did]
			} else if s.Due(sp, now) {
				req := uint64(rapid.IntRange(0, 100).Draw(rt, "req"))
				c := Counts{Requests: req, Errors: uint64(rapid.IntRange(0, int(req)).Draw(rt, "err"))}
				b := Counts{Requests: uint64(rapid.IntRange(0, 1000).Draw(rt, "breq"))}
				s.Decide(sp, now, c, b)
				decisions++
			} else if before != Running && s.Due(sp, now) {
				rt.Fatalf("a %s rollout is due", before)
			}
			if s.Step < step || s.Step >= len(sp.Steps) {
				rt.Fatalf("step %d after %d", s.Step, step)
			}
			if before.Ended() && s.Status != before {
				rt.Fatalf("%s became %s", before, s.Status)
			}
			p := s.Percent(sp)
			if p != 0 && p != 100 && p != sp.Steps[s.Step] {
				rt.Fatalf("share %v at step %d", p, s.Step)
			}
			if len(s.History) != min(decisions, MaxHistory) {
				rt.Fatalf("%d records after %d decisions", len(s.History), decisions)
			}
			for j := 1; j < len(s.History); j++ {
				if s.History[j].At.Before(s.History[j-1].At) {
					rt.Fatal("history out of order")
				}
			}
		}
	})
}

// TestEdges: no request is an error rate of 0; a baseline of exactly min_requests is judged;
// the history keeps exactly MaxHistory records, the oldest going first.
func TestEdges(t *testing.T) {
	if f := figures(Counts{}); f.ErrorRate != 0 || f.TTFTP99Ms != -1 {
		t.Fatalf("figures of nothing %+v", f)
	}
	sp := spec()
	s := Start(t0)
	rec := s.Decide(sp, t0.Add(sp.Interval), Counts{Requests: 1000, Errors: 16}, Counts{Requests: sp.MinRequests, Errors: 2})
	if rec.Decision != Rollback {
		t.Fatalf("a baseline of min_requests was not judged: %s", rec.Decision)
	}
	s = Start(t0)
	for i := range MaxHistory {
		s.Act(sp, []string{Pause, Resume}[i%2], t0.Add(time.Duration(i)*time.Second))
	}
	if len(s.History) != MaxHistory || !s.History[0].At.Equal(t0) {
		t.Fatalf("%d records, the first at %v", len(s.History), s.History[0].At)
	}
	s.Act(sp, Pause, t0.Add(time.Hour))
	if len(s.History) != MaxHistory || !s.History[0].At.Equal(t0.Add(time.Second)) || !s.History[MaxHistory-1].At.Equal(t0.Add(time.Hour)) {
		t.Fatalf("%d records from %v to %v", len(s.History), s.History[0].At, s.History[len(s.History)-1].At)
	}
}
