package policy

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/tlgw/tlgw/internal/kvindex"
	"github.com/tlgw/tlgw/internal/prefixindex"
	"github.com/tlgw/tlgw/internal/ttftmodel"
)

// teach fits m's model (through p) to ttft = base + perK ms per 1,000 uncached tokens, with no
// load term, from exact varied observations.
func teach(p *PredictedLatency, m *Member, base, perK float64) {
	r := rand.New(rand.NewPCG(uint64(base), uint64(perK)))
	for range 200 {
		x := ttftmodel.Features(int64(r.IntN(8)), r.IntN(8000))
		p.Observe(m, x, base+perK*x[ttftmodel.KTokens])
	}
}

// chunks returns n distinct chained chunk hashes of prompt k.
func chunks(k, n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = uint64(k)<<32 | uint64(i+1)
	}
	return hs
}

// TestPredictedLatencyWorkedExample is the doc comment's example.
func TestPredictedLatencyWorkedExample(t *testing.T) {
	p := NewPredictedLatency(1.25)
	ms := []*Member{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	for i, l := range []int64{1, 1, 0} {
		p.Add(ms[i], l, 1)
	}
	teach(p, ms[0], 10, 100)
	teach(p, ms[1], 5, 25)
	teach(p, ms[2], 5, 25)
	x := prefixindex.New(0)
	prompt := chunks(1, 128) // 2,048 tokens
	x.Record("a", prompt[:120])
	if got := p.Cap(); got != 2 {
		t.Fatalf("cap = %d, want 2", got)
	}
	p.SetLatencyRequest(x, prompt, 0)
	if m, r := p.Pick(0, nil); m != ms[0] || r != ReasonPredicted {
		t.Fatalf("got %s (%v), want a (predicted): 22.8 ms against 56.2", m.ID, r)
	}
	if f, want := p.Features(), (ttftmodel.X{1, 1, 0.128}); f != want {
		t.Fatalf("features %v, want %v", f, want)
	}
	p.SetLatencyRequest(x, prompt, 20)
	if m, _ := p.Pick(0, nil); m != ms[0] {
		t.Fatalf("objective 20 ms, none meets it: got %s, want a (lowest prediction)", m.ID)
	}
	p.SetLatencyRequest(x, prompt, 0)
	if m, _ := p.Pick(0, []string{"a"}); m != ms[2] {
		t.Fatalf("a excluded: got %s, want c (56.2 ms twice, c less loaded)", m.ID)
	}
	// Without a request installed every member is predicted for an empty prompt: b and c
	// tie at 5 ms, and c is less loaded.
	if m, _ := p.Pick(0, nil); m != ms[2] {
		t.Fatalf("no prompt: got %s, want c", m.ID)
	}
}

// TestPredictedLatencyCacheUnderObjective is the doc comment's second example.
func TestPredictedLatencyCacheUnderObjective(t *testing.T) {
	p := NewPredictedLatency(1.25)
	ms := []*Member{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	for i, l := range []int64{1, 1, 0} {
		p.Add(ms[i], l, 1)
	}
	teach(p, ms[0], 10, 300)
	teach(p, ms[1], 5, 10)
	teach(p, ms[2], 5, 10)
	x := prefixindex.New(0)
	prompt := chunks(1, 128)
	x.Record("a", prompt[:120])
	for _, c := range []struct {
		slo  float64
		want *Member
	}{{0, ms[2]}, {60, ms[0]}, {30, ms[2]}} {
		p.SetLatencyRequest(x, prompt, c.slo)
		if m, _ := p.Pick(0, nil); m != c.want {
			t.Errorf("objective %v ms: got %s, want %s", c.slo, m.ID, c.want.ID)
		}
	}
}

// TestPredictedLatencyObjective: a member predicted to meet the objective beats one that does
// not, and among those that meet it (with equal cached prefixes) the less loaded wins, then
// the smaller id, whatever their predictions.
func TestPredictedLatencyObjective(t *testing.T) {
	p := NewPredictedLatency(4)
	a, b := &Member{ID: "a"}, &Member{ID: "b"}
	p.Add(a, 0, 1)
	p.Add(b, 0, 1)
	teach(p, a, 50, 0)
	teach(p, b, 30, 0)
	p.SetLatencyRequest(nil, nil, 40)
	if m, _ := p.Pick(0, nil); m != b {
		t.Fatalf("got %s, want b (30 ms meets 40)", m.ID)
	}
	p.SetLatencyRequest(nil, nil, 60)
	if m, _ := p.Pick(0, nil); m != a {
		t.Fatalf("both meet 60: got %s, want a (equal loads, smaller id)", m.ID)
	}
	p.SetLoad(a, 1)
	p.SetLatencyRequest(nil, nil, 60)
	if m, _ := p.Pick(0, nil); m != b {
		t.Fatalf("both meet 60, a busier: got %s, want b", m.ID)
	}
	p.SetLatencyRequest(nil, nil, 0)
	p.SetLoad(b, 1)
	if m, _ := p.Pick(0, nil); m != b {
		t.Fatalf("no objective: got %s, want b (lower prediction)", m.ID)
	}
}

// TestPredictedLatencyLearnsFromObservations: an untrained pool picks the least loaded; once
// one member is taught it is slow, the other takes its requests.
func TestPredictedLatencyLearnsFromObservations(t *testing.T) {
	p := NewPredictedLatency(10)
	a, b := &Member{ID: "a"}, &Member{ID: "b"}
	p.Add(a, 0, 1)
	p.Add(b, 1, 1)
	if m, _ := p.Pick(0, nil); m != a {
		t.Fatalf("untrained: got %s, want a (less loaded)", m.ID)
	}
	if n, w, ok := Model(a); ok || n != 0 || w != (ttftmodel.X{}) {
		t.Fatalf("untrained model listed: %d observations, weights %v, ok %v", n, w, ok)
	}
	teach(p, a, 500, 0)
	if m, _ := p.Pick(0, nil); m != b {
		t.Fatalf("a taught slow: got %s, want b", m.ID)
	}
	if n, w, ok := Model(a); !ok || n != 200 || math.Abs(w[ttftmodel.Bias]-500) > 1 {
		t.Fatalf("a's model: %d observations, weights %v, ok %v; want 200 observations and a bias near 500 ms", n, w, ok)
	}
	// Leaving and rejoining keeps what was learnt.
	p.Remove(a)
	p.Add(a, 0, 1)
	if m, _ := p.Pick(0, nil); m != b {
		t.Fatalf("after a rejoined: got %s, want b", m.ID)
	}
}

// bruteLatency is predicted_latency's rule from scratch: candidates under the cap and not
// excluded; the deepest match among them; a candidate holding that depth's chunk is matched
// to it (every candidate when more than wideMarks workers hold it); the least by (meets the
// objective; if it does −matched, load, id; else prediction bucket, −matched, load, id), and
// the features the model is asked about it: its load and the prompt tokens it does not hold.
func bruteLatency(p *PredictedLatency, x holdings, hashes []uint64, slo float64, exclude []string) (*Member, ttftmodel.X) {
	limit := p.Cap()
	var cands []*Member
	for _, r := range p.rows {
		if r.m.load < limit && !slices.Contains(exclude, r.m.ID) {
			cands = append(cands, r.m)
		}
	}
	depth := 0
	if x != nil {
		for _, m := range cands {
			depth = max(depth, x.match(m, hashes))
		}
	}
	holders := 0
	if depth > 0 {
		holders = x.holders(hashes[depth-1])
	}
	type key struct {
		meets   bool
		bucket  int64
		matched int
		m       *Member
		x       ttftmodel.X
	}
	var keys []key
	prompt := len(hashes) * tokensPerChunk
	for _, m := range cands {
		matched := 0
		if depth > 0 && (holders > wideMarks || x.holds(m, hashes[depth-1])) {
			matched = depth
		}
		f := ttftmodel.Features(m.load, prompt-matched*tokensPerChunk)
		pred := Predict(m, f)
		keys = append(keys, key{slo > 0 && pred <= slo, int64(pred / TieMs), matched, m, f})
	}
	if len(keys) == 0 {
		return nil, ttftmodel.X{}
	}
	slices.SortFunc(keys, func(a, b key) int {
		switch {
		case a.meets != b.meets:
			if a.meets {
				return -1
			}
			return 1
		case a.meets && a.matched != b.matched:
			return b.matched - a.matched
		case !a.meets && a.bucket != b.bucket:
			return int(a.bucket - b.bucket)
		case a.matched != b.matched:
			return b.matched - a.matched
		case less(a.m, b.m):
			return -1
		case less(b.m, a.m):
			return 1
		}
		return 0
	})
	return keys[0].m, keys[0].x
}

// holdings is what bruteLatency reads of an index: the approximate one (approx) or the exact
// one (exact).
type holdings interface {
	match(m *Member, hashes []uint64) int
	holds(m *Member, id uint64) bool
	holders(id uint64) int
}

type approx struct{ x *prefixindex.Index }

func (a approx) match(m *Member, hashes []uint64) int { return a.x.Match(m.ID, hashes) }
func (a approx) holds(m *Member, id uint64) bool      { return a.x.Holds(m.ID, id) }
func (a approx) holders(id uint64) int {
	n := 0
	hs := a.x.Holders(id)
	for _, ok := hs.Next(); ok; _, ok = hs.Next() {
		n++
	}
	return n
}

type exact struct{ x *HeldIndex }

func (e exact) match(m *Member, hashes []uint64) int { return e.x.Match(m, hashes) }
func (e exact) holds(m *Member, id uint64) bool      { return e.x.Holds(m, id) }
func (e exact) holders(id uint64) int                { return len(e.x.Holders(id)) }

// TestPredictedLatencyMatchesBruteForce: on random pools, models, prefixes and exclusions the
// pick is the from-scratch rule's, over the approximate index or (SetHeld) the exact one.
func TestPredictedLatencyMatchesBruteForce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 90).Draw(t, "n")
		p := NewPredictedLatency(rapid.Float64Range(1, 2).Draw(t, "c"))
		x, held := prefixindex.New(0), kvindex.New[*Member](0)
		useExact := rapid.Bool().Draw(t, "exact")
		ms := make([]*Member, n)
		prompts := rapid.IntRange(1, 4).Draw(t, "prompts")
		// Members join in any order (the pick's ties go to the smallest id whatever the
		// order), and some leave and come back.
		ids := make([]int, n)
		for i := range ids {
			ids[i] = i
		}
		order := rapid.Permutation(ids).Draw(t, "order")
		for _, i := range order {
			ms[i] = &Member{ID: fmt.Sprintf("w%02d", i)}
			p.Add(ms[i], int64(rapid.IntRange(0, 6).Draw(t, "load")), 1)
			if rapid.Bool().Draw(t, "trained") {
				base := float64(rapid.IntRange(0, 50).Draw(t, "base"))
				perK := float64(rapid.IntRange(0, 400).Draw(t, "perK"))
				teach(p, ms[i], base, perK)
			}
			if k := rapid.IntRange(0, prompts).Draw(t, "holds"); k > 0 {
				hs := chunks(k, rapid.IntRange(1, 40).Draw(t, "held"))
				held.Store(ms[i], hs)
				if useExact {
					// The approximate index believes otherwise: the exact one must win.
					hs = chunks(rapid.IntRange(1, prompts).Draw(t, "believed"), rapid.IntRange(1, 40).Draw(t, "believedLen"))
				}
				x.Record(ms[i].ID, hs)
			}
		}
		for range rapid.IntRange(0, 3).Draw(t, "rejoins") {
			m := ms[rapid.IntRange(0, n-1).Draw(t, "rejoin")]
			p.Remove(m)
			if rapid.Bool().Draw(t, "back") {
				p.Add(m, m.load, 1)
			}
		}
		for range 5 {
			hashes := chunks(rapid.IntRange(1, prompts).Draw(t, "prompt"), rapid.IntRange(0, 40).Draw(t, "len"))
			var exclude []string
			for range rapid.IntRange(0, 3).Draw(t, "excluded") {
				exclude = append(exclude, ms[rapid.IntRange(0, n-1).Draw(t, "ex")].ID)
			}
			slo := float64(rapid.SampledFrom([]int{0, 10, 100, 1000}).Draw(t, "slo"))
			var want *Member
			var wantX ttftmodel.X
			p.SetLatencyRequest(x, hashes, slo)
			if useExact {
				want, wantX = bruteLatency(p, exact{held}, hashes, slo, exclude)
				p.SetHeld(held, hashes)
			} else {
				want, wantX = bruteLatency(p, approx{x}, hashes, slo, exclude)
			}
			got, _ := p.Pick(0, exclude)
			if got != want {
				t.Fatalf("Pick = %v, brute force = %v", got, want)
			}
			if got != nil && p.Features() != wantX {
				t.Fatalf("features of %s = %v, brute force = %v", got.ID, p.Features(), wantX)
			}
			if got != nil && rapid.Bool().Draw(t, "reserve") {
				p.SetLoad(got, got.load+1)
			}
			// Members leave and join between picks: rows move under the pick's cached
			// worker numbers.
			switch m := ms[rapid.IntRange(0, n-1).Draw(t, "churned")]; rapid.IntRange(0, 2).Draw(t, "churn") {
			case 1:
				p.Remove(m)
			case 2:
				if !p.contains(m) {
					p.Add(m, m.load, 1)
				}
			}
		}
	})
}

// TestPredictedLatencyMeets: Meets says whether the pick's member was predicted within the
// objective and, when not, whether some member not excluded would be at no load — over the
// cap or not: waiting for load to fall can help only then.
func TestPredictedLatencyMeets(t *testing.T) {
	p := NewPredictedLatency(1)
	a, b := &Member{ID: "a"}, &Member{ID: "b"}
	p.Add(a, 0, 1)
	p.Add(b, 0, 1)
	r := rand.New(rand.NewPCG(1, 2))
	for _, m := range []*Member{a, b} { // 10 ms + 20 ms per request in flight
		for range 200 {
			x := ttftmodel.Features(int64(r.IntN(8)), r.IntN(4000))
			p.Observe(m, x, 10+20*x[ttftmodel.Load])
		}
	}
	check := func(what string, slo float64, exclude []string, now, idle bool) {
		t.Helper()
		p.SetLatencyRequest(nil, nil, slo)
		p.Pick(0, exclude)
		if n, i := p.Meets(); n != now || i != idle {
			t.Fatalf("%s: Meets() = %v, %v; want %v, %v", what, n, i, now, idle)
		}
	}
	check("no objective", 0, nil, true, true)
	check("idle and in time", 15, nil, true, true)
	p.SetLoad(a, 1)
	p.SetLoad(b, 1) // both at 30 ms
	check("loaded, in time", 30.5, nil, true, true)
	check("loaded, in time idle", 20, nil, false, true)
	check("not even idle", 9, nil, false, false)
	p.SetLoad(a, 0) // b over the cap of 1 now; a at 10 ms
	check("the one under the cap excluded, the other in time idle", 20, []string{"a"}, false, false)
	p.SetLoad(a, 1)
	p.SetLoad(b, 0)
	check("a over the cap, b in time idle", 9.5, nil, false, false)
	check("b at 10 ms", 10.5, nil, true, true)
	p.SetLoad(b, 2) // the cap is 2 now: both under it, b at 50 ms, a at 30
	check("a (30 ms) would be in time idle, b excluded", 25, []string{"b"}, false, true)
	c := &Member{ID: "c"}
	p.Add(c, 0, 1)
	teach(p, c, 100, 0)
	check("only c (100 ms), the fast ones excluded", 25, []string{"a", "b"}, false, false)
}

// TestPredictedLatencyCapBoundary: a member whose load is at the cap is not a candidate, even
// when it alone holds the prompt and is predicted fastest; one under it is (the cap and the
// total follow SetLoad and Remove).
func TestPredictedLatencyCapBoundary(t *testing.T) {
	p := NewPredictedLatency(1)
	ms := []*Member{{ID: "a"}, {ID: "b"}, {ID: "c"}}
	for _, m := range ms {
		p.Add(m, 0, 1)
	}
	teach(p, ms[0], 5, 10)
	teach(p, ms[1], 50, 200)
	teach(p, ms[2], 50, 200)
	x := prefixindex.New(0)
	prompt := chunks(1, 16)
	x.Record("a", prompt)
	p.SetLoad(ms[0], 1) // total 1: cap ⌈1·2/3⌉ = 1, a is at it
	if got := p.Cap(); got != 1 {
		t.Fatalf("cap %d, want 1", got)
	}
	p.SetLatencyRequest(x, prompt, 0)
	if m, _ := p.Pick(0, nil); m == ms[0] {
		t.Fatal("a member at the cap was picked")
	}
	p.SetLoad(ms[1], 1) // total 2: cap ⌈1·3/3⌉ = 1
	p.SetLoad(ms[2], 1) // total 3: cap ⌈1·4/3⌉ = 2, every member under it
	if got := p.Cap(); got != 2 {
		t.Fatalf("cap %d, want 2", got)
	}
	p.SetLatencyRequest(x, prompt, 0)
	if m, _ := p.Pick(0, nil); m != ms[0] {
		t.Fatalf("got %s, want a (under the cap, holding the prompt, fastest)", m.ID)
	}
	p.Remove(ms[2])
	p.Remove(ms[2]) // twice: nothing more leaves
	p.SetLoad(ms[2], 7)
	if got := p.Cap(); got != 2 { // total 2 over 2 members: ⌈1·3/2⌉
		t.Fatalf("cap %d after c left, want 2", got)
	}
}

// TestPredictedLatencyWideHolders: when more than wideMarks workers hold the prompt's deepest
// cached chunk, every candidate is taken to hold it (their predictions use the held depth);
// at wideMarks or fewer, only the holders are. Over either index.
func TestPredictedLatencyWideHolders(t *testing.T) {
	for _, useExact := range []bool{false, true} {
		for _, holders := range []int{wideMarks, wideMarks + 1} {
			p := NewPredictedLatency(10)
			x, held := prefixindex.New(0), kvindex.New[*Member](0)
			prompt := chunks(1, 64) // 1,024 tokens
			var ms []*Member
			for i := range wideMarks + 2 {
				m := &Member{ID: fmt.Sprintf("w%03d", i)}
				ms = append(ms, m)
				p.Add(m, 1, 1)
				teach(p, m, 10, 100)
				if i < holders {
					x.Record(m.ID, prompt)
					held.Store(m, prompt)
				}
			}
			last := ms[len(ms)-1]
			p.SetLoad(last, 0) // the least loaded, and never a holder
			p.SetLatencyRequest(x, prompt, 0)
			if useExact {
				p.SetHeld(held, prompt)
			}
			m, _ := p.Pick(0, nil)
			isHeld := p.Features()[ttftmodel.KTokens] == 0
			// Wide: the least loaded, taken to hold the prompt; else a holder (10 ms against
			// 112.4 ms for the least loaded, which does not hold it).
			if wide := holders > wideMarks; !isHeld || (m == last) != wide {
				t.Fatalf("exact %v, %d holders: picked %s with features %v", useExact, holders, m.ID, p.Features())
			}
		}
	}
}

// TestRank: the packed order — within the objective before outside it; then (within) held
// before not, then load; (outside) the prediction's TieMs bucket, then held, then load; a
// prediction exactly at the objective meets it; loads past 2⁴⁰ tie without reaching the held
// bit.
func TestRank(t *testing.T) {
	ordered := []struct {
		pred, slo float64
		held      bool
		load      int64
	}{
		{40, 50, true, 0},
		{50, 50, true, 1 << 50},
		{10, 50, false, 0},
		{49, 50, false, 1},
		{50.5, 50, true, 9},
		{50.9, 50, false, 0},
		{51.2, 50, true, 0},
		{51.9, 50, true, 3},
	}
	for i := 1; i < len(ordered); i++ {
		a, b := ordered[i-1], ordered[i]
		if ra, rb := rank(a.pred, a.slo, a.held, a.load), rank(b.pred, b.slo, b.held, b.load); ra >= rb {
			t.Errorf("rank%v = %#x not below rank%v = %#x", a, ra, b, rb)
		}
	}
	if rank(7, 0, true, 1<<41) != rank(7, 0, true, 1<<40-1) || rank(7, 0, true, -3) != rank(7, 0, true, 0) {
		t.Error("loads outside [0, 2⁴⁰) are not clamped")
	}
}

// TestPredictedLatencyMeetsIdleCountsTheCache: whether a member would be in time idle is
// predicted with the prompt tokens it holds: a holder that misses the objective only by its
// load would meet it idle, though the whole prompt's prefill would not.
func TestPredictedLatencyMeetsIdleCountsTheCache(t *testing.T) {
	p := NewPredictedLatency(10)
	a, b := &Member{ID: "a"}, &Member{ID: "b"}
	r := rand.New(rand.NewPCG(3, 4))
	// a: 10 ms + 50 ms per request in flight + 100 ms per 1,000 tokens; b the same from 100 ms.
	for _, mb := range []struct {
		m    *Member
		base float64
	}{{a, 10}, {b, 100}} {
		m, base := mb.m, mb.base
		p.Add(m, 0, 1)
		for range 300 {
			x := ttftmodel.Features(int64(r.IntN(6)), r.IntN(4000))
			p.Observe(m, x, base+50*x[ttftmodel.Load]+100*x[ttftmodel.KTokens])
		}
	}
	p.SetLoad(a, 2)
	p.SetLoad(b, 2)
	x := prefixindex.New(0)
	prompt := chunks(1, 128) // 2,048 tokens
	x.Record("a", prompt[:120])
	// a: 10 + 100 + 12.8 = 122.8 ms now, 22.8 idle; b: 404.8 now, 304.8 idle (112.8 had it
	// held the prompt: so only a's own cache can make the answer yes).
	p.SetLatencyRequest(x, prompt, 50)
	if m, _ := p.Pick(0, nil); m != a {
		t.Fatalf("picked %s, want a (lowest prediction)", m.ID)
	}
	if now, idle := p.Meets(); now || !idle {
		t.Fatalf("Meets() = %v, %v; want false, true (a would be in time idle, with its cache)", now, idle)
	}
	// An objective exactly at a's idle prediction is met; a hair below it is not.
	idleA := ttftmodel.PredictWith(a.ttft.Weights(), ttftmodel.Features(0, (128-120)*tokensPerChunk))
	for _, c := range []struct {
		slo  float64
		idle bool
	}{{idleA, true}, {math.Nextafter(idleA, 0), false}} {
		p.SetLatencyRequest(x, prompt, c.slo)
		p.Pick(0, nil)
		if now, idle := p.Meets(); now || idle != c.idle {
			t.Fatalf("objective %v ms (a idle %v ms): Meets() = %v, %v; want false, %v", c.slo, idleA, now, idle, c.idle)
		}
	}
}
