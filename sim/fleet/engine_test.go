package fleet

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"pgregory.net/rapid"

	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/prefixindex"
)

// TestScaledEngine: a heterogeneous engine's speed divides both per-token times and its
// memory multiplies the KV blocks, never below one block.
func TestScaledEngine(t *testing.T) {
	m := EngineModel{KVBlocks: 100, BlockSize: 16, MaxRunning: 8, PrefillPerToken: 100 * time.Microsecond, DecodePerToken: 10 * time.Millisecond}
	for _, c := range []struct {
		speed, mem float64
		want       EngineModel
	}{
		{2, 2, EngineModel{KVBlocks: 200, BlockSize: 16, MaxRunning: 8, PrefillPerToken: 50 * time.Microsecond, DecodePerToken: 5 * time.Millisecond}},
		{0.5, 0.5, EngineModel{KVBlocks: 50, BlockSize: 16, MaxRunning: 8, PrefillPerToken: 200 * time.Microsecond, DecodePerToken: 20 * time.Millisecond}},
		{1, 0.001, EngineModel{KVBlocks: 1, BlockSize: 16, MaxRunning: 8, PrefillPerToken: 100 * time.Microsecond, DecodePerToken: 10 * time.Millisecond}},
	} {
		if got := m.scaled(c.speed, c.mem); got != c.want {
			t.Errorf("scaled(%v, %v) = %+v, want %+v", c.speed, c.mem, got, c.want)
		}
	}
	o := Options{Workers: 4, Heterogeneous: true, Engine: m}
	ms := o.models()
	if ms[0] != m.scaled(0.5, 0.5) || ms[1] != m || ms[2] != m.scaled(2, 2) || ms[3] != ms[0] {
		t.Fatalf("heterogeneous fleet %+v", ms)
	}
}

// TestEngineSlots: an engine runs at most MaxRunning requests; its in-flight count is the
// running and the queued ones; a prompt fits when its blocks and one more token's do (as
// tlengine's errTooLong).
func TestEngineSlots(t *testing.T) {
	e := newEngine("e0", EngineModel{KVBlocks: 64, BlockSize: 16, MaxRunning: 2})
	prompt := func(first uint32) []uint32 {
		p := make([]uint32, 20)
		for i := range p {
			p[i] = first + uint32(i)
		}
		return p
	}
	for i := range 2 {
		if _, _, ok := e.tryStart(prompt(uint32(100 * i))); !ok {
			t.Fatalf("start %d refused with %d running", i, e.run)
		}
	}
	if _, _, ok := e.tryStart(prompt(1000)); ok {
		t.Fatal("a third request started on an engine of 2 slots")
	}
	e.queue = append(e.queue, 7, 8, 9)
	e.head = 1
	if got := e.inFlight(); got != 4 {
		t.Fatalf("inFlight = %d with 2 running and 2 waiting", got)
	}
	small := newEngine("e1", EngineModel{KVBlocks: 4, BlockSize: 16, MaxRunning: 1})
	if !small.fits(63) || small.fits(64) {
		t.Fatalf("4 blocks of 16: fits(63) = %v, fits(64) = %v; want true, false", small.fits(63), small.fits(64))
	}
}

// TestFinishCachesTheAnswer: a finished request's answer joins its KV, so the next turn of a
// conversation (prompt + answer + more) finds both cached.
func TestFinishCachesTheAnswer(t *testing.T) {
	e := newEngine("e0", EngineModel{KVBlocks: 64, BlockSize: 16, MaxRunning: 4})
	turn := make([]uint32, 0, 80)
	for i := range 32 {
		turn = append(turn, uint32(i+1))
	}
	seq, _, ok := e.tryStart(turn)
	if !ok {
		t.Fatal("not started")
	}
	answer := make([]uint32, 32)
	for i := range answer {
		answer[i] = uint32(1000 + i)
	}
	e.finish(e.pool, seq, answer)
	if e.run != 0 {
		t.Fatalf("%d running after finish", e.run)
	}
	next := append(append(turn, answer...), 5, 6, 7)
	_, cached, ok := e.tryStart(next)
	if !ok {
		t.Fatal("next turn not started")
	}
	if cached != 64 {
		t.Fatalf("next turn found %d tokens cached, want 64 (its prompt and answer)", cached)
	}
}

// TestEventsOrder: events pop by time, and events at one time in the order they were pushed.
func TestEventsOrder(t *testing.T) {
	var q events
	type ev struct {
		at  int64
		idx int32
	}
	in := []ev{{5, 0}, {3, 1}, {5, 2}, {3, 3}, {1, 4}, {5, 5}, {3, 6}, {9, 7}, {1, 8}}
	for _, e := range in {
		q.push(e.at, evArrive, e.idx)
	}
	want := []int32{4, 8, 1, 3, 6, 0, 2, 5, 7}
	for i, w := range want {
		if len(q.h) == 0 {
			t.Fatalf("empty after %d pops", i)
		}
		if got := q.pop(); got.idx != w {
			t.Fatalf("pop %d = event %d at %d, want %d", i, got.idx, got.at, w)
		}
	}
	if len(q.h) != 0 {
		t.Fatalf("%d events left", len(q.h))
	}
}

// TestOfferedRate: each result reports the arrival rate its run offered, Load × the fleet's
// estimated capacity.
func TestOfferedRate(t *testing.T) {
	o := Options{Trace: TraceSharedPrefix, Workers: 3, Requests: 200, Load: 0.5, Seed: 4, Policies: []string{"round_robin", "least_outstanding"}}
	rep, err := Run(o)
	if err != nil {
		t.Fatal(err)
	}
	if err := o.defaults(); err != nil {
		t.Fatal(err)
	}
	tr, err := genTrace(o.Trace, o.Requests, o.Workers, o.Adapters, o.Seed)
	if err != nil {
		t.Fatal(err)
	}
	want := round(0.5*capacity(o.models(), tr), 2)
	for _, r := range rep.Results {
		if r.OfferedRPS != want || want <= 0 {
			t.Errorf("%s: offered %v req/s, want %v", r.Policy, r.OfferedRPS, want)
		}
	}
}

// TestShortBodyGivesTheSameKey: the body a pick without a prefix index writes (only as much
// as the prefix key reads) gives the key of the whole body, for messages of every length
// around the key's 64 bytes.
func TestShortBodyGivesTheSameKey(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 5).Draw(t, "messages")
		msgs := make([]message, n)
		for i := range msgs {
			msgs[i] = message{
				role: role(rapid.IntRange(0, 2).Draw(t, "role")),
				seg:  rapid.Uint64().Draw(t, "seg"),
				n:    int32(rapid.IntRange(0, 40).Draw(t, "tokens")),
			}
		}
		seed := rapid.Uint64().Draw(t, "seed")
		whole, err := oai.PrefixKey(oai.Chat, chatBody(nil, seed, msgs, true))
		if err != nil {
			t.Fatal(err)
		}
		short := chatBody(nil, seed, msgs, false)
		key, err := oai.PrefixKey(oai.Chat, short)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(key, whole) {
			t.Fatalf("messages %+v: short body's key %q, whole body's %q", msgs, key, whole)
		}
		if long := chatBody(nil, seed, msgs, true); len(short) > len(long) {
			t.Fatalf("the short body (%d bytes) is longer than the whole one (%d)", len(short), len(long))
		}
	})
}

// TestResultFromItsCounts: a run's figures from the counts it kept — nearest-rank
// percentiles, the SLO over every request (a rejected one misses it), hit tokens over lookups
// summed over the engines and the pools restarts replaced, time averages for the imbalance.
func TestResultFromItsCounts(t *testing.T) {
	m := EngineModel{KVBlocks: 16, BlockSize: 4, MaxRunning: 4}
	a, b := newEngine("w0", m), newEngine("w1", m)
	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	for range 2 { // the second allocation finds the first's two full blocks
		seq, _, _ := a.tryStart(prompt)
		a.finish(a.pool, seq, nil)
	}
	st := a.pool.Stats()
	if st.HitTokens != 8 || st.LookupTokens != 18 {
		t.Fatalf("pool stats %+v, want 8 hit tokens of 18 looked up", st)
	}
	b.oldHit, b.oldLook = 30, 82
	r := &runner{
		o: &Options{SLOTTFT: 3 * time.Millisecond}, tr: &trace{reqs: make([]request, 6)},
		engines: []*engine{a, b}, ttft: []float64{5, 1, 3, 2, 4}, queueSum: 2.5, rejected: 1, held: 2,
		lastDone: int64(4 * time.Second), outTokens: 1000,
	}
	// Two samples: in flight 3 and 1, then 0 and 4.
	a.run, b.run = 3, 1
	r.sample()
	a.run, b.run = 0, 4
	r.sample()
	got := r.result("p")
	want := Result{
		Policy: "p", Requests: 6, Completed: 5, Rejected: 1, Held: 2,
		HitRate:   0.38, // (8 + 30) / (18 + 82)
		TTFTP50Ms: 3, TTFTP99Ms: 5, TTFTMeanMs: 3, QueueMeanMs: 0.5,
		SLOAttainment: 0.5, // 1, 2 and 3 ms of 6 requests
		SimSeconds:    4, TokensPerS: 250,
		Imbalance: 1.75, // the largest counts (3 + 4) over the means (2 + 2)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("result (-want +got):\n%s", diff)
	}
	for _, c := range []struct {
		n    int
		q    float64
		want float64
	}{{1, 0.99, 0}, {100, 0.99, 98}, {100, 0.50, 49}, {101, 0.50, 50}, {200, 0.99, 197}, {3, 0.5, 1}} {
		sorted := make([]float64, c.n)
		for i := range sorted {
			sorted[i] = float64(i)
		}
		if got := percentile(sorted, c.q); got != c.want {
			t.Errorf("percentile of 0..%d at %v = %v, want %v", c.n-1, c.q, got, c.want)
		}
	}
}

// TestStartTimesTheRequest: a request that starts 3 ms after it arrived waited 3 ms and has
// its first token after the prefill of its uncached tokens; its end follows the decode.
func TestStartTimesTheRequest(t *testing.T) {
	m := EngineModel{KVBlocks: 16, BlockSize: 4, MaxRunning: 4, PrefillPerToken: time.Millisecond, DecodePerToken: 2 * time.Millisecond}
	e := newEngine("w0", m)
	r := &runner{
		o: &Options{}, tr: &trace{reqs: []request{{out: message{n: 5}}}},
		engines: []*engine{e}, jobs: make([]job, 1), now: int64(5 * time.Millisecond),
	}
	r.jobs[0] = job{arrival: int64(2 * time.Millisecond), prompt: 10}
	seq, _, _ := e.tryStart([]uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	r.start(0, seq, 4)
	if len(r.ttft) != 1 || r.ttft[0] != 9 || r.queueSum != 3 {
		t.Fatalf("ttft %v ms, queue %v ms; want [9] (3 waiting + 6 uncached tokens) and 3", r.ttft, r.queueSum)
	}
	if ev := r.q.pop(); ev.kind != evDone || ev.at != int64(21*time.Millisecond) {
		t.Fatalf("done event %+v, want at 21 ms (first token at 11 ms + 5 tokens of 2 ms)", ev)
	}
}

// TestBarHeights: the plot's bars stand in proportion to their values — the hit rate against
// 1, TTFT p99 against the largest — side by side in the order of the results.
func TestBarHeights(t *testing.T) {
	rep := &Report{Results: []Result{
		{Policy: "a", HitRate: 1, TTFTP99Ms: 100},
		{Policy: "b", HitRate: 0.5, TTFTP99Ms: 50},
		{Policy: "c", HitRate: 0.25, TTFTP99Ms: 200},
	}}
	img := plot(t, rep)
	// The layout WritePNG documents in its constants: bars 90 px wide, 50 apart, a 40 px
	// margin, the plot 300 px tall from y = 48 with 16 px kept for the labels.
	const barW, gap, margin, top, plotH = 90, 50, 40, 48, 300
	panelW := margin + 3*(barW+gap) + gap
	if b := img.Bounds(); b.Dx() != 2*panelW+margin {
		t.Fatalf("width %d, want %d", b.Dx(), 2*panelW+margin)
	}
	cols := []color.RGBA{{52, 120, 198, 255}, {214, 96, 77, 255}}
	want := [2][3]int{{284, 142, 71}, {142, 71, 284}}
	for p := range 2 {
		for i := range 3 {
			x := margin + p*panelW + gap + i*(barW+gap) + 3 // clear of the centred value label
			h := 0
			for y := top + plotH - 1; y >= top; y-- {
				if color.RGBAModel.Convert(img.At(x, y)) != cols[p] {
					break
				}
				h++
			}
			if h != want[p][i] {
				t.Errorf("panel %d, bar %d: %d px tall, want %d", p, i, h, want[p][i])
			}
		}
	}
}

// TestSweepPoints: a sweep's points sit at their load (by value, across the plot's width) and
// their value (TTFT p99 against the largest, SLO attainment against 1), in their policy's
// colour.
func TestSweepPoints(t *testing.T) {
	rep := &Report{Results: []Result{
		{Policy: "a", Load: 0.5, TTFTP99Ms: 100, SLOAttainment: 1},
		{Policy: "b", Load: 0.5, TTFTP99Ms: 50, SLOAttainment: 0.8},
		{Policy: "a", Load: 1, TTFTP99Ms: 200, SLOAttainment: 0.5},
		{Policy: "b", Load: 1, TTFTP99Ms: 100, SLOAttainment: 0.2},
		{Policy: "a", Load: 0.75, TTFTP99Ms: 150, SLOAttainment: 0.75},
	}}
	img := plot(t, rep)
	// writeSweepPNG's layout: panels of 560 × 300 px with 60 px margins, from y = 48, 8 px kept
	// at the top.
	const margin, top, plotW, plotH = 60, 48, 560, 300
	base := top + plotH
	for _, c := range []struct {
		panel int
		load  float64
		frac  float64 // of the panel's range
		col   color.RGBA
	}{
		{0, 0.5, 0.5, lineColors[0]}, {0, 1, 1, lineColors[0]}, {0, 0.75, 0.75, lineColors[0]},
		{0, 0.5, 0.25, lineColors[1]}, {0, 1, 0.5, lineColors[1]},
		{1, 0.5, 1, lineColors[0]}, {1, 1, 0.5, lineColors[0]}, {1, 0.75, 0.75, lineColors[0]},
		{1, 0.5, 0.8, lineColors[1]}, {1, 1, 0.2, lineColors[1]},
	} {
		x := c.panel*(plotW+2*margin) + margin + int((c.load-0.5)/0.5*plotW)
		y := base - int(c.frac*float64(plotH-8))
		if got := color.RGBAModel.Convert(img.At(x, y)); got != c.col {
			t.Errorf("panel %d, load %v, at %v of the range: pixel (%d, %d) is %v, want %v", c.panel, c.load, c.frac, x, y, got, c.col)
		}
	}
}

// TestChunkBlocksFollowTheRenderedPrompt: the block carrying each chunk, from the layout the
// simulator assumes, agrees with the gateway's own rendering of the request: chunk k is carried
// by the block of the last token whose text starts before byte 64·(k+1) of the rendered
// prompt, and the chunk count is the gateway's.
func TestChunkBlocksFollowTheRenderedPrompt(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 4).Draw(t, "messages")
		msgs := make([]message, n)
		for i := range msgs {
			msgs[i] = message{role: role(rapid.IntRange(0, 2).Draw(t, "role")), seg: uint64(i + 1),
				n: int32(rapid.IntRange(0, 60).Draw(t, "tokens"))}
		}
		bs := rapid.SampledFrom([]int{1, 4, 16}).Draw(t, "block size")
		render := func(ms []message) []byte {
			body := chatBody(nil, 9, ms, true)
			return oai.RenderPrompt(oai.Chat, body, len(body))
		}
		rendered := render(msgs)
		// Each token's first byte in the rendered prompt: its message's content starts after the
		// earlier messages' rendering and the role's line.
		var starts []int
		for j, m := range msgs {
			content := len(render(msgs[:j])) + len(roleNames[m.role]) + 1
			if j == 0 {
				content = len(roleNames[m.role]) + 1
			}
			one := render([]message{{role: m.role, seg: m.seg, n: 1}})
			if len(one) != len(roleNames[m.role])+1+4+1 {
				t.Fatalf("a token renders as %d bytes with its message, want 4", len(one)-len(roleNames[m.role])-2)
			}
			for tok := range int(m.n) {
				starts = append(starts, content+4*tok)
			}
		}
		chunks := len(prefixindex.Hashes(nil, rendered))
		got := chunkBlocks(nil, msgs, chunks, bs)
		if len(got) != chunks {
			t.Fatalf("%d blocks for %d chunks", len(got), chunks)
		}
		for k := range chunks {
			before := 0
			for _, s := range starts {
				if s < (k+1)*prefixindex.ChunkBytes {
					before++
				}
			}
			want := -1
			if before > 0 {
				want = (before - 1) / bs
			}
			if got[k] != want {
				t.Fatalf("chunk %d of %q: block %d, want %d (%d tokens start before its end)", k, rendered, got[k], want, before)
			}
		}
	})
}

// TestChunkBlocksExamples: worked cases of chunkBlocks.
func TestChunkBlocksExamples(t *testing.T) {
	for _, c := range []struct {
		msgs   []message
		chunks int
		bs     int
		want   []int
	}{
		// "system\n" + 1 token + "\n": one chunk, its one token in block 0.
		{[]message{{role: roleSystem, n: 1}}, 1, 16, []int{0}},
		// "user\n\n": one chunk and no token.
		{[]message{{role: roleUser}}, 1, 16, []int{-1}},
		// "system\n" then 40 tokens from byte 7: 15 start before byte 64 (7 + 4·14 = 63), 31
		// before byte 128, and all 40 before the partial third chunk's end.
		{[]message{{role: roleSystem, n: 40}}, 3, 4, []int{3, 7, 9}},
	} {
		if got := chunkBlocks(nil, c.msgs, c.chunks, c.bs); !slices.Equal(got, c.want) {
			t.Errorf("chunkBlocks(%+v, %d, %d) = %v, want %v", c.msgs, c.chunks, c.bs, got, c.want)
		}
	}
}

// plot is rep's PNG, decoded.
func plot(t *testing.T, rep *Report) image.Image {
	t.Helper()
	var buf bytes.Buffer
	if err := rep.WritePNG(&buf); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}
