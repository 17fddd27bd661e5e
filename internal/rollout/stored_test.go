package rollout

import (
	"math"
	"strings"
	"testing"
	"time"
)

var specA = Spec{Canary: "v4", Baseline: "v3", Steps: []float64{10, 100}, Interval: time.Minute, MinRequests: 10,
	MaxErrorRatio: 1.5, MaxTTFTP99Ratio: 1.25, MaxErrorRate: 0.05}

// TestSpecKey: equal specs, equal keys; any field changed, another key.
func TestSpecKey(t *testing.T) {
	k := SpecKey(specA)
	if len(k) != 32 || SpecKey(specA) != k {
		t.Fatalf("key %q", k)
	}
	for i, f := range []func(*Spec){
		func(s *Spec) { s.Canary = "v5" }, func(s *Spec) { s.Baseline = "v2" },
		func(s *Spec) { s.Canary, s.Baseline = "v4v", "3" }, // the same bytes split elsewhere
		func(s *Spec) { s.Steps = []float64{20, 100} }, func(s *Spec) { s.Steps = []float64{100} },
		func(s *Spec) { s.Interval++ }, func(s *Spec) { s.MinRequests++ }, func(s *Spec) { s.MaxErrorRatio = 2 },
		func(s *Spec) { s.MaxTTFTP99Ratio = 2 }, func(s *Spec) { s.MaxErrorRate = 0 },
	} {
		s := specA
		s.Steps = append([]float64(nil), specA.Steps...)
		f(&s)
		if SpecKey(s) == k {
			t.Errorf("change %d: same key", i)
		}
	}
}

// TestStoredRoundTrip: a state encodes and decodes to itself, and fits its spec only.
func TestStoredRoundTrip(t *testing.T) {
	st := Start(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	st.Decide(specA, st.WindowStart.Add(time.Minute), Counts{Requests: 20}, Counts{Requests: 20})
	s := Stored{Spec: SpecKey(specA), State: st}
	b, err := s.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeStored(b)
	if err != nil || !got.State.Same(st) || got.Spec != s.Spec || got.State.History[0].Decision != Advance {
		t.Fatalf("%+v %v", got, err)
	}
	if !got.Fits(specA) {
		t.Fatal("does not fit its spec")
	}
	other := specA
	other.MinRequests = 11
	if got.Fits(other) {
		t.Fatal("fits another spec")
	}
	got.State.Step = 2
	if got.Fits(specA) {
		t.Fatal("a step the spec lacks fits")
	}
	if _, err := DecodeStored([]byte(`{"spec":"` + s.Spec + `","state":{"status":"paused","step":0,"window_start":"2026-01-01T00:00:00Z","history":[]},"newer":1}`)); err != nil {
		t.Fatalf("a newer replica's field: %v", err)
	}
}

// TestDecodeStoredRefuses: each invalid stored value is refused with its reason.
func TestDecodeStoredRefuses(t *testing.T) {
	key := SpecKey(specA)
	state := func(s string) string { return `{"spec":"` + key + `","state":` + s + `}` }
	long := `{"at":"2026-01-01T00:00:00Z","decision":"hold"}`
	for _, c := range []struct{ val, want string }{
		{strings.Repeat(" ", MaxStoredBytes+1), "over the bound"},
		{`[]`, "not a stored rollout"},
		{state(`{"status":"running","window_start":"2026-01-01T00:00:00Z"}`) + `{}`, "more after"},
		{`{"spec":"abc","state":{"status":"paused"}}`, "spec"},
		{`{"spec":"` + strings.Repeat("z", 32) + `","state":{"status":"paused"}}`, "spec"},
		{state(`{"status":"sleeping"}`), "status"},
		{state(`{"status":"paused","step":-1}`), "step"},
		{state(`{"status":"paused","step":32}`), "step 32: want 0 to 31"},
		{state(`{"status":"running"}`), "window start"},
		{state(`{"status":"paused","history":[` + strings.TrimSuffix(strings.Repeat(long+",", MaxHistory+1), ",") + `]}`), "records"},
	} {
		if _, err := DecodeStored([]byte(c.val)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%.60s: %v, want %q", c.val, err, c.want)
		}
	}
	at := state(`{"status":"paused"}`)
	if _, err := DecodeStored([]byte(at + strings.Repeat(" ", MaxStoredBytes-len(at)))); err != nil {
		t.Fatalf("exactly MaxStoredBytes: %v", err)
	}
	big := Stored{Spec: key, State: State{Status: Paused, History: []Record{{Reason: strings.Repeat("r", MaxStoredBytes)}}}}
	if _, err := big.Encode(); err == nil || !strings.Contains(err.Error(), "over the bound") {
		t.Fatalf("encoding over the bound: %v", err)
	}
	big.State.History[0].Reason = "r"
	b, _ := big.Encode()
	big.State.History[0].Reason = strings.Repeat("r", MaxStoredBytes-len(b)+1)
	if b, err := big.Encode(); err != nil || len(b) != MaxStoredBytes {
		t.Fatalf("encoding exactly MaxStoredBytes: %d %v", len(b), err)
	}
	if _, err := DecodeStored([]byte(state(`{"status":"paused","step":31,"history":[` + strings.TrimSuffix(strings.Repeat(long+",", MaxHistory), ",") + `]}`))); err != nil {
		t.Fatalf("at the bounds: %v", err)
	}
}

// TestStateHistoryHelpers: Same, After, Counted, Clone.
func TestStateHistoryHelpers(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	r := func(m int, d string) Record { return Record{At: at.Add(time.Duration(m) * time.Minute), Decision: d} }
	a := State{Status: Running, WindowStart: at, History: []Record{r(1, Advance)}}
	b := a.Clone()
	b.History = append(b.History, r(2, Pause), r(3, Hold))
	if !a.Same(a.Clone()) || a.Same(b) {
		t.Fatal("Same")
	}
	c := a.Clone()
	c.History[0].At = at
	if a.Same(c) {
		t.Fatal("Same ignores the newest record's time")
	}
	for _, d := range []func(*State){func(s *State) { s.Step++ }, func(s *State) { s.Status = Paused }, func(s *State) { s.WindowStart = at.Add(1) }} {
		c := a.Clone()
		d(&c)
		if a.Same(c) {
			t.Fatalf("Same after a change: %+v", c)
		}
	}
	if got := b.After(a); len(got) != 2 || got[0].Decision != Pause {
		t.Fatalf("After %+v", got)
	}
	if got := b.After(State{}); len(got) != 3 {
		t.Fatalf("After nothing: %d", len(got))
	}
	if got := a.After(b); got != nil {
		t.Fatalf("After a newer: %+v", got)
	}
	if r(0, Pause).Counted() || r(0, Resume).Counted() || !r(0, Hold).Counted() || !r(0, Abort).Counted() {
		t.Fatal("Counted")
	}
	b.Clone().History[0].Decision = Abort
	if b.History[0].Decision != Advance {
		t.Fatal("Clone shares the history")
	}
}

// TestDecideAt: windows stay back to back when the verdict comes within an interval of the
// window's end, and start at the verdict when it comes later.
func TestDecideAt(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	due := at.Add(time.Minute)
	s := Start(at)
	rec := s.DecideAt(specA, due, due.Add(2*time.Second), Counts{Requests: 20}, Counts{Requests: 20})
	if !s.WindowStart.Equal(due) || !rec.At.Equal(due) || rec.Decision != Advance {
		t.Fatalf("%+v %+v", s, rec)
	}
	s = Start(at)
	late := due.Add(time.Minute)
	s.DecideAt(specA, due, late, Counts{}, Counts{})
	if !s.WindowStart.Equal(late) {
		t.Fatalf("late verdict: window %v", s.WindowStart)
	}
}

// TestTally: Add sums and saturates; Counts is cumulative by bound.
func TestTally(t *testing.T) {
	a := Tally{Requests: 3, Errors: 1}
	a.TTFT[0], a.TTFT[16] = 2, 1
	b := Tally{Requests: math.MaxUint64, Errors: 2}
	b.TTFT[0] = 5
	s := a.Add(b)
	if s.Requests != math.MaxUint64 || s.Errors != 3 || s.TTFT[0] != 7 || s.TTFT[16] != 1 {
		t.Fatalf("%+v", s)
	}
	c := a.Add(a).Counts()
	if c.Requests != 6 || c.TTFT[TTFTBuckets[0]] != 4 || c.TTFT[TTFTBuckets[15]] != 4 || c.TTFT[math.Inf(1)] != 6 {
		t.Fatalf("%+v", c)
	}
	var full Tally
	full.TTFT[0], full.TTFT[1] = math.MaxUint64, 1
	if c := full.Counts(); c.TTFT[TTFTBuckets[1]] != math.MaxUint64 {
		t.Fatalf("cumulative wrapped: %d", c.TTFT[TTFTBuckets[1]])
	}
}

// FuzzDecodeStored: whatever is stored, decoding returns a state within its bounds or an error.
func FuzzDecodeStored(f *testing.F) {
	b, _ := Stored{Spec: SpecKey(specA), State: Start(time.Unix(1, 0))}.Encode()
	f.Add(b)
	f.Add([]byte(`{"spec":"","state":{}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := DecodeStored(b)
		if err != nil {
			return
		}
		if st.State.Step < 0 || st.State.Step >= MaxSteps || len(st.State.History) > MaxHistory || len(st.Spec) != 32 {
			t.Fatalf("%+v", st)
		}
		_ = st.State.Percent(specA)
	})
}
