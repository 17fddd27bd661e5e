package policy

import (
	"fmt"
	"testing"

	"pgregory.net/rapid"

	"github.com/tlgw/tlgw/internal/kvindex"
	"github.com/tlgw/tlgw/internal/prefixindex"
)

// warmPolicy is one prefix policy with its index, as a warm-up test drives it: holdings are
// leading runs of one prompt's chunk hashes.
type warmPolicy interface {
	Policy
	Warmer
	Cap() int64
	hold(m *Member, hashes []uint64) // m holds hashes (a leading run)
	install(hashes []uint64)         // the next pick's prefix
}

type warmPrecise struct {
	*PrecisePrefix
	x *HeldIndex
}

func (w warmPrecise) hold(m *Member, hashes []uint64) { w.x.Store(m, hashes) }
func (w warmPrecise) install(hashes []uint64)         { w.SetHeld(w.x, hashes) }

type warmApprox struct {
	*PrefixAware
	x *prefixindex.Index
}

func (w warmApprox) hold(m *Member, hashes []uint64) { w.x.Record(m.ID, hashes) }
func (w warmApprox) install(hashes []uint64)         { w.SetPrefix(w.x, hashes) }

// predicted_latency with the exact index, and with the approximate one; with no objective
// and no observations it ranks the holders of the deepest cached chunk first, then by load.
type warmPredictedHeld struct {
	*PredictedLatency
	x *HeldIndex
}

func (w warmPredictedHeld) hold(m *Member, hashes []uint64) { w.x.Store(m, hashes) }
func (w warmPredictedHeld) install(hashes []uint64)         { w.SetHeld(w.x, hashes) }

type warmPredictedApprox struct {
	*PredictedLatency
	x *prefixindex.Index
}

func (w warmPredictedApprox) hold(m *Member, hashes []uint64) { w.x.Record(m.ID, hashes) }
func (w warmPredictedApprox) install(hashes []uint64)         { w.SetLatencyRequest(w.x, hashes, 0) }

func warmPolicies() map[string]func() warmPolicy {
	return map[string]func() warmPolicy{
		"precise_prefix": func() warmPolicy { return warmPrecise{NewPrecisePrefix(1.25), kvindex.New[*Member](0)} },
		"prefix_aware":   func() warmPolicy { return warmApprox{NewPrefixAware(1.25), prefixindex.New(1 << 10)} },
		"predicted_latency/held": func() warmPolicy {
			return warmPredictedHeld{NewPredictedLatency(1.25), kvindex.New[*Member](0)}
		},
		"predicted_latency/approx": func() warmPolicy {
			return warmPredictedApprox{NewPredictedLatency(1.25), prefixindex.New(1 << 10)}
		},
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// prefixPick reports whether a pick went to its member for the prefix it holds: reason prefix,
// or predicted_latency's reason for a member holding some of the prompt.
func prefixPick(r Reason, depth int) bool {
	return r == ReasonPrefix || (r == ReasonPredicted && depth > 0)
}

// pickCounted picks for hashes and counts the pick in the member's load, as the router does
// before it asks for a warm-up.
func pickCounted(p warmPolicy, hashes []uint64, exclude []string) (*Member, Reason) {
	p.install(hashes)
	m, r := p.Pick(0, exclude)
	if m != nil {
		p.SetLoad(m, m.load+1)
	}
	return m, r
}

// TestWarmWorkedExample: four members, c = 1.25, loads a 3, b 2, c 4, d 4; a holds the
// prompt's 10 chunks. The first pick leaves a at 4 under the cap of 5; the second leaves it at
// the cap, so b (the least loaded, 2 + 1 < 5) gets a copy of the 10 chunks, named by chunk 8
// (slack 2). Each line after it changes one thing that stops the warm-up.
func TestWarmWorkedExample(t *testing.T) {
	hashes := promptHashes(1, 2, 10, 10)
	type setup struct {
		minChunks, slack int
		exclude          []string
		also             func(p warmPolicy, ms []*Member) // more holdings
		want             string                           // "" = no warm-up
	}
	for _, tc := range []struct {
		name string
		setup
	}{
		{"warm", setup{minChunks: 10, slack: 2, want: "b"}},
		{"no slack", setup{minChunks: 1, slack: 0, want: "b"}},
		{"short prefix", setup{minChunks: 11, slack: 2}},
		{"another holder of depth 8 under the cap", setup{minChunks: 1, slack: 2,
			also: func(p warmPolicy, ms []*Member) { p.hold(ms[2], hashes[:8]) }}},
		{"a holder short of depth 8 does not count", setup{minChunks: 1, slack: 2, want: "b",
			also: func(p warmPolicy, ms []*Member) { p.hold(ms[2], hashes[:7]) }}},
		{"the target holds it already", setup{minChunks: 1, slack: 2,
			also: func(p warmPolicy, ms []*Member) { p.hold(ms[1], hashes[:8]) }}},
		{"the next least loaded has no room", setup{minChunks: 1, slack: 2, exclude: []string{"b"}}},
	} {
		for name, mk := range warmPolicies() {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				p := mk()
				var ms []*Member
				for i, load := range []int64{3, 2, 4, 4} {
					m := &Member{ID: string(rune('a' + i))}
					p.Add(m, load, 1)
					ms = append(ms, m)
				}
				p.hold(ms[0], hashes)
				if tc.also != nil {
					tc.also(p, ms)
				}
				if m, r := pickCounted(p, hashes, nil); m != ms[0] || !prefixPick(r, 10) {
					t.Fatalf("first pick %v (%v)", m.ID, r)
				}
				if got, _, _ := p.Warm(tc.minChunks, tc.slack, tc.exclude); got != nil {
					t.Fatalf("warm-up to %s with a under the cap", got.ID)
				}
				if m, _ := pickCounted(p, hashes, nil); m != ms[0] {
					t.Fatalf("second pick %v", m.ID)
				}
				got, chunks, id := p.Warm(tc.minChunks, tc.slack, tc.exclude)
				if tc.want == "" {
					if got != nil {
						t.Fatalf("warm-up to %s", got.ID)
					}
					return
				}
				d := max(10-tc.slack, 1)
				if got == nil || got.ID != tc.want || chunks != 10 || id != hashes[d-1] {
					t.Fatalf("warm-up %v, %d chunks, id %x; want %s, 10, %x", got, chunks, id, tc.want, hashes[d-1])
				}
				if again, _, _ := p.Warm(tc.minChunks, tc.slack, tc.exclude); again != nil {
					t.Fatal("Warm answered twice for one pick")
				}
			})
		}
	}
}

// TestWarmWidelyHeld: a prefix more than wideHolders workers hold is not warmed, though all
// its holders but the picked one are over the cap: 34 of 100 members hold the prompt, 33 of
// them at load 20, m00 at 8 (the cap is 9 after its pick), the other 66 idle.
func TestWarmWidelyHeld(t *testing.T) {
	hashes := promptHashes(7, 8, 10, 10)
	for name, mk := range warmPolicies() {
		t.Run(name, func(t *testing.T) {
			p := mk()
			var ms []*Member
			for i := range 100 {
				m := &Member{ID: fmt.Sprintf("m%02d", i)}
				load := int64(0)
				switch {
				case i == 0:
					load = 8
				case i < 34:
					load = 20
				}
				p.Add(m, load, 1)
				if i < 34 {
					p.hold(m, hashes)
				}
				ms = append(ms, m)
			}
			if m, r := pickCounted(p, hashes, nil); m != ms[0] || !prefixPick(r, 10) || m.load != p.Cap() {
				t.Fatalf("picked %v (%v) at %d, cap %d", m.ID, r, m.load, p.Cap())
			}
			if got, _, _ := p.Warm(1, 0, nil); got != nil {
				t.Fatalf("a warm-up to %s of a prefix 34 workers hold", got.ID)
			}
		})
	}
}

// TestWarmForgetsEarlierPicks: a pick made without a prefix, or one answered least_load,
// leaves nothing for Warm, whatever the pick before it left; a member that left the pool
// gets no warm-up for it.
func TestWarmForgetsEarlierPicks(t *testing.T) {
	hashes := promptHashes(3, 4, 6, 6)
	for name, mk := range warmPolicies() {
		t.Run(name, func(t *testing.T) {
			p := mk()
			a, b, c := &Member{ID: "a"}, &Member{ID: "b"}, &Member{ID: "c"}
			p.Add(a, 0, 1)
			p.Add(b, 0, 1)
			p.Add(c, 4, 1) // c's load makes room under the cap for b
			p.hold(a, hashes)
			// prime leaves a prefix pick that warms b: a's last pick left it at the cap.
			prime := func() {
				p.SetLoad(a, 0)
				p.SetLoad(b, 0)
				for a.load < p.Cap() {
					pickCounted(p, hashes, nil)
				}
			}
			prime()
			if got, _, _ := p.Warm(1, 0, nil); got != b {
				t.Fatalf("warm-up to %v, want b", got)
			}
			prime()
			p.Pick(0, nil) // no prefix installed
			if got, _, _ := p.Warm(1, 0, nil); got != nil {
				t.Fatalf("warm-up to %s after a pick without a prefix", got.ID)
			}
			prime()
			p.install(promptHashes(9, 9, 6, 6)) // held by nobody: least_load
			if _, r := p.Pick(0, nil); prefixPick(r, 0) {
				t.Fatalf("reason %v", r)
			}
			if got, _, _ := p.Warm(1, 0, nil); got != nil {
				t.Fatalf("warm-up to %s after a pick for no prefix", got.ID)
			}
			prime()
			p.Remove(a)
			if got, _, _ := p.Warm(1, 0, nil); got != nil {
				t.Fatalf("warm-up to %s for a member that left", got.ID)
			}
		})
	}
}

// TestWarmMatchesDefinition: over random pools, loads and holdings (some holders outside the
// pool, some prefixes held by more than wideHolders workers), Warm after a counted pick
// answers what policy.Warmer's comment defines.
func TestWarmMatchesDefinition(t *testing.T) {
	for name, mk := range warmPolicies() {
		t.Run(name, func(t *testing.T) {
			// About one draw in eight asks for a warm-up: five rounds of rapid's hundred.
			for range 5 {
				rapid.Check(t, func(t *rapid.T) { checkWarmDefinition(t, mk()) })
			}
		})
	}
}

func checkWarmDefinition(t *rapid.T, p warmPolicy) {
	chunks := rapid.IntRange(1, 12).Draw(t, "chunks")
	hashes := promptHashes(5, 6, chunks, chunks)
	n := rapid.IntRange(1, 45).Draw(t, "members")
	maxLoad := rapid.IntRange(0, 8).Draw(t, "maxLoad")
	var ms, pool []*Member
	depth := map[*Member]int{}
	for i := range n + 2 { // the last two are not in the pool
		m := &Member{ID: fmt.Sprintf("m%02d", i)}
		if i < n {
			p.Add(m, int64(rapid.IntRange(0, maxLoad).Draw(t, "load")), 1)
			pool = append(pool, m)
		}
		if d := rapid.IntRange(-2*chunks, chunks).Draw(t, "held"); d > 0 { // most hold nothing
			p.hold(m, hashes[:d])
			depth[m] = d
		}
		ms = append(ms, m)
	}
	if rapid.Bool().Draw(t, "tight") {
		// Most draws above leave some holder under the cap; here the holders are brought
		// to the cap or one below it (the pick then fills one), as warm-ups need.
		room, full := rapid.IntRange(0, n-1).Draw(t, "room"), rapid.Bool().Draw(t, "full")
		if depth[pool[room]] == 0 {
			depth[pool[room]] = rapid.IntRange(1, chunks).Draw(t, "roomHeld")
			p.hold(pool[room], hashes[:depth[pool[room]]])
		}
		for range 4 { // raising loads raises the cap: a few rounds reach it
			limit := p.Cap()
			for i, m := range pool {
				if depth[m] > 0 {
					p.SetLoad(m, max(limit-int64(b2i(i == room && !full)), 0))
				}
			}
		}
	}
	var exclude []string
	if rapid.Bool().Draw(t, "exclude") {
		exclude = []string{ms[rapid.IntRange(0, n-1).Draw(t, "excluded")].ID}
	}
	minChunks := rapid.IntRange(0, 2).Draw(t, "minChunks")
	if rapid.Bool().Draw(t, "long") {
		minChunks = rapid.IntRange(0, chunks+1).Draw(t, "minChunks")
	}
	slack := rapid.IntRange(0, 3).Draw(t, "slack")
	picked, reason := pickCounted(p, hashes, exclude)
	got, gotChunks, gotID := p.Warm(minChunks, slack, exclude)

	// The definition.
	var want *Member
	wantChunks, wantID := 0, uint64(0)
	func() {
		if picked == nil || !prefixPick(reason, depth[picked]) || depth[picked] < max(minChunks, 1) {
			return
		}
		limit := p.Cap()
		if picked.load < limit {
			return
		}
		d := max(depth[picked]-slack, 1)
		holders := 0
		for _, m := range ms {
			if depth[m] >= d {
				holders++
			}
		}
		if holders > wideHolders {
			return
		}
		for _, m := range pool {
			if depth[m] >= d && m.load < limit {
				return
			}
		}
		var t *Member
		for _, m := range pool {
			if !excluded(m.ID, exclude) && (t == nil || less(m, t)) {
				t = m
			}
		}
		if t == nil || t == picked || t.load+1 >= limit || depth[t] >= d {
			return
		}
		want, wantChunks, wantID = t, depth[picked], hashes[d-1]
	}()
	if got != want || gotChunks != wantChunks || gotID != wantID {
		t.Fatalf("Warm = %v, %d, %x; want %v, %d, %x", got, gotChunks, gotID, want, wantChunks, wantID)
	}
}

// TestWarmHolderBoundary: wideHolders holders of the prefix, all but the picked one over the
// cap, are few enough to warm (the least loaded non-holder gets a copy); one more is widely
// held and never warmed. The picked member m00 starts idle and is picked until its load
// reaches the cap; the other holders sit at 20, far over it.
func TestWarmHolderBoundary(t *testing.T) {
	hashes := promptHashes(7, 8, 10, 10)
	for name, mk := range warmPolicies() {
		for _, holders := range []int{wideHolders, wideHolders + 1} {
			t.Run(fmt.Sprint(name, "/", holders), func(t *testing.T) {
				p := mk()
				var ms []*Member
				for i := range 100 {
					m := &Member{ID: fmt.Sprintf("m%02d", i)}
					load := int64(0)
					if i > 0 && i < holders {
						load = 20
					}
					p.Add(m, load, 1)
					if i < holders {
						p.hold(m, hashes)
					}
					ms = append(ms, m)
				}
				for range 100 {
					if m, r := pickCounted(p, hashes, nil); m != ms[0] || !prefixPick(r, 10) {
						t.Fatalf("picked %v (%v), want m00 for its prefix", m.ID, r)
					}
					if ms[0].load >= p.Cap() {
						break
					}
				}
				if ms[0].load != p.Cap() {
					t.Fatalf("m00 at %d, cap %d", ms[0].load, p.Cap())
				}
				var want *Member
				if holders <= wideHolders {
					want = ms[holders] // the first idle non-holder
				}
				if got, _, _ := p.Warm(1, 0, nil); got != want {
					t.Fatalf("%d holders: warm-up to %v, want %v", holders, got, want)
				}
			})
		}
	}
}
