package policy

import (
	"math"
	"slices"
	"strings"

	"github.com/tlgw/tlgw/internal/prefixindex"
	"github.com/tlgw/tlgw/internal/ttftmodel"
)

// LatencyScorer is implemented by policies that pick by predicted time to first token
// (predicted_latency). As with PrefixScorer, the router installs the request's part right
// before the Pick it is meant for and Pick clears it: the approximate prefix index (nil when
// off: no member is believed to hold any of the prompt), the prompt's chunk hashes (their
// number is the prompt's size, at tokensPerChunk each) and the request's TTFT objective in
// milliseconds (0 = none). After a Pick, Features is what
// the model was asked about the picked member; the requester echoes it with the TTFT it
// measured, which the router hands to Observe.
type LatencyScorer interface {
	SetLatencyRequest(x *prefixindex.Index, hashes []uint64, sloMs float64)
	Features() ttftmodel.X
	// Meets reports whether the last Pick's member was predicted to meet the objective (now;
	// true when the request had none) and, when it was not, whether some member would be at
	// no load (idle): whether waiting for load to fall can help.
	Meets() (now, idle bool)
	// Observe teaches m's model one measured TTFT, as the package's Observe, and refreshes
	// the policy's copy of its weights.
	Observe(m *Member, x ttftmodel.X, ttftMs float64)
}

// Observe teaches m's model one TTFT the gateway measured for a request picked with features
// x. The model lives on the member, so it survives the member leaving and rejoining its pool;
// a member in a predicted_latency pool is taught through the policy's Observe instead.
func Observe(m *Member, x ttftmodel.X, ttftMs float64) {
	if m.ttft == nil {
		m.ttft = new(ttftmodel.Model)
	}
	m.ttft.Observe(x, ttftMs)
}

// Predict is m's predicted TTFT in milliseconds for features x (0 before any observation).
func Predict(m *Member, x ttftmodel.X) float64 {
	if m.ttft == nil {
		return 0
	}
	return m.ttft.Predict(x)
}

// Model reports m's TTFT model as the admin listing shows it: the observations it learnt from
// since its last reset and its weights; ok false before its first observation.
func Model(m *Member) (observations uint64, weights ttftmodel.X, ok bool) {
	if m.ttft == nil {
		return 0, ttftmodel.X{}, false
	}
	return m.ttft.Observations(), m.ttft.Weights(), true
}

// TieMs is how close two predictions must be to count as a tie, broken by the longer cached
// prefix and then the lower load: predictions a millisecond apart are noise, and a cached
// prefix keeps the cache warm for the next request.
const TieMs = 1.0

// wideMarks bounds the holders of the deepest cached chunk a pick stamps (see
// PredictedLatency).
const wideMarks = 64

// tokensPerChunk is the prompt tokens of one prefix-index chunk (64 bytes at ~4 bytes a token,
// the gateway's estimate).
const tokensPerChunk = prefixindex.ChunkBytes / 4

// PredictedLatency is predicted_latency (R18.2): among the members under the bounded-load cap
//
//	cap = ⌈c·(m+1)/n⌉   (m = total load of the pool, n = members), as affinity (R3.3),
//
// and not excluded, it picks by each member's predicted TTFT, its own online model
// (internal/ttftmodel) over its load and the prompt tokens it is not believed to hold (the
// prompt's chunks minus its match in the approximate index). Predictions are compared in
// TieMs buckets. Without an objective: the lowest prediction, ties to the longest cached
// prefix. With an objective (R18.4): the members predicted to meet it come first, and among
// them the longest cached prefix, then the lower load — any of them serves this request in
// time, the cache keeps the next one fast and the load spreads, where the fastest would
// spread each prompt over more caches and crowd the fast workers (docs/simulate.md measures
// it); when none is predicted to meet it, the lowest prediction, ties to the longest cached
// prefix. Remaining ties go to the lower load, then the smaller id.
//
// Worked example: 3 members, c = 1.25, loads 1, 1, 0, prompt 2,048 tokens (128 chunks), the
// first holding 120 chunks; models: the first 10 ms + 100 ms/1,000 tokens, the second and
// third 5 ms + 25 ms/1,000 tokens (four times faster). cap = ⌈1.25·3/3⌉ = 2, all are
// candidates; predictions: 10 + 0.128·100 = 22.8 ms, 5 + 2.048·25 = 56.2 ms twice; the first
// wins although the others are faster. With an objective of 20 ms no member meets it and the
// first still wins (lowest prediction); were the first excluded, the third (load 0) would.
// Under an objective the cache comes first: with models of 10 ms + 300 ms/1,000 tokens for the
// first (48.4 ms) and 5 ms + 10 ms/1,000 tokens for the others (25.5 ms), no objective picks
// the third (lowest, and less loaded than the second); 60 ms the first (all meet it, and it
// holds the prefix); 30 ms the third again (only the fast ones meet it).
//
// The prompt tokens a member holds come from the exact index (SetHeld: what its engine reports
// it caches, R18.3) when the router installs it, else from the approximate index (what the
// gateway sent it). The match is read for the prompt's deepest cached depth only: a binary search over the
// depths, as prefix_aware's, finds the deepest chunk a candidate holds, its holders are
// stamped with a generation, and the scan over the members counts the stamped ones as holding
// that many chunks and the others none. When more than wideMarks workers hold that chunk (a
// system prompt most of the fleet has served), walking them all would cost more than the rest
// of the pick, so every candidate is taken to hold it. The pick is one pass over a dense table
// of the members kept sorted by id (a few multiply-adds and one packed comparison each, see
// rank; no member is read to break a tie) plus O(log L) index lookups and at most wideMarks
// holders, and allocates nothing.
type PredictedLatency struct {
	c     float64
	total int64
	peer  int64    // PeerLoader
	rows  []latRow // the members, densely, for the pick's scan; Member.row indexes it
	byID  map[string]*Member
	nums  []int32 // row+1 by the prefix index's worker number (a cache checked against the id)
	gen   uint32
	// The next pick's request, and the features of the last pick.
	held   *HeldIndex // the exact index, when installed: it stands for idx
	idx    *prefixindex.Index
	hashes []uint64
	slo    float64
	last   ttftmodel.X
	// The last pick's prefix, for Warm, and the index it was read from.
	warm     lastPrefix
	warmHeld *HeldIndex
	warmIdx  *prefixindex.Index
	meets    bool // the last pick met its objective
	idle     bool // … or some member would at no load
}

// latRow is what the pick reads of one member, side by side with the others.
type latRow struct {
	w    ttftmodel.X // the member's model's weights (zero before its first observation)
	load int64
	m    *Member
	mark uint32 // the pick (gen) that found it holding the prompt's deepest cached chunk
}

var (
	_ Policy        = (*PredictedLatency)(nil)
	_ LatencyScorer = (*PredictedLatency)(nil)
	_ HeldScorer    = (*PredictedLatency)(nil)
)

// NewPredictedLatency returns an empty predicted_latency policy with load factor c (≥ 1;
// default 1.25).
func NewPredictedLatency(c float64) *PredictedLatency {
	c = loadFactor(c)
	return &PredictedLatency{c: c, byID: make(map[string]*Member)}
}

// SetLatencyRequest implements LatencyScorer.
func (p *PredictedLatency) SetLatencyRequest(x *prefixindex.Index, hashes []uint64, sloMs float64) {
	p.idx, p.hashes, p.slo = x, hashes, sloMs
}

// SetHeld implements HeldScorer: for the next Pick, the exact index (R18.3) stands for the
// approximate one; the router installs it only when every member's engine reports what it
// holds.
func (p *PredictedLatency) SetHeld(x *HeldIndex, hashes []uint64) { p.held, p.hashes = x, hashes }

// Features implements LatencyScorer.
func (p *PredictedLatency) Features() ttftmodel.X { return p.last }

// Meets implements LatencyScorer.
func (p *PredictedLatency) Meets() (now, idle bool) { return p.meets, p.meets || p.idle }

// Observe implements LatencyScorer.
func (p *PredictedLatency) Observe(m *Member, x ttftmodel.X, ttftMs float64) {
	Observe(m, x, ttftMs)
	if p.contains(m) {
		p.rows[m.row].w = m.ttft.Weights()
	}
}

func (p *PredictedLatency) contains(m *Member) bool {
	return m.row >= 0 && int(m.row) < len(p.rows) && p.rows[m.row].m == m
}

// Add implements Policy. The rows stay sorted by id, so the pick's scan meets equal
// candidates smallest id first and never reads a member to break a tie.
func (p *PredictedLatency) Add(m *Member, load, weight int64) {
	m.load, m.weight = load, weight
	i, _ := slices.BinarySearchFunc(p.rows, m.ID, func(r latRow, id string) int { return strings.Compare(r.m.ID, id) })
	r := latRow{load: load, m: m}
	if m.ttft != nil {
		r.w = m.ttft.Weights()
	}
	p.rows = slices.Insert(p.rows, i, r)
	p.renumber(i)
	p.total += load
	p.byID[m.ID] = m
}

// Remove implements Policy.
func (p *PredictedLatency) Remove(m *Member) {
	if !p.contains(m) {
		return
	}
	i := int(m.row)
	p.rows = slices.Delete(p.rows, i, i+1)
	p.renumber(i)
	p.total -= m.load
	m.row = -1
	delete(p.byID, m.ID)
}

// renumber sets the row of every member from row i on (membership changes are rare beside
// picks: a registration or an ejection moves at most the rows after it).
func (p *PredictedLatency) renumber(i int) {
	for ; i < len(p.rows); i++ {
		p.rows[i].m.row = int32(i)
	}
}

// SetLoad implements Policy.
func (p *PredictedLatency) SetLoad(m *Member, load int64) {
	if p.contains(m) {
		p.total += load - m.load
		p.rows[m.row].load = load
	}
	m.load = load
}

// SetWeight implements Policy; predicted_latency ignores weights.
func (p *PredictedLatency) SetWeight(m *Member, weight int64) { m.weight = weight }

// Len implements Policy.
func (p *PredictedLatency) Len() int { return len(p.rows) }

// Cap is the bounded-load cap ⌈c·(m+1)/n⌉ for the pool as it stands.
func (p *PredictedLatency) Cap() int64 { return peerCap(p.c, p.total, p.peer, len(p.rows)) }

// SetPeerLoad implements PeerLoader.
func (p *PredictedLatency) SetPeerLoad(peer int64) { p.peer = max(peer, 0) }

// Pick implements Policy. key is not read: the request arrives by SetLatencyRequest.
func (p *PredictedLatency) Pick(_ uint64, exclude []string) (*Member, Reason) {
	idx, hashes, slo, held := p.idx, p.hashes, p.slo, p.held
	p.idx, p.hashes, p.slo, p.held = nil, nil, 0, nil
	p.meets, p.idle = false, false
	p.warm, p.warmHeld, p.warmIdx = lastPrefix{}, nil, nil
	if len(p.rows) == 0 {
		return nil, ReasonPredicted
	}
	limit := p.Cap()
	depth, allHeld := 0, false
	if held != nil && len(hashes) > 0 {
		if depth = p.deepestHeld(held, hashes, limit, exclude); depth > 0 {
			p.gen++
			if hs := held.Holders(hashes[depth-1]); len(hs) > wideMarks {
				allHeld = true // most of the fleet holds it (see PredictedLatency)
			} else {
				for _, m := range hs {
					if p.contains(m) {
						p.rows[m.row].mark = p.gen
					}
				}
			}
		}
	} else if idx != nil && len(hashes) > 0 {
		if depth = p.deepest(idx, hashes, limit, exclude); depth > 0 {
			p.gen++
			hs := idx.Holders(hashes[depth-1])
			walked := 0
			for num, id, ok := hs.NextNum(); ok; num, id, ok = hs.NextNum() {
				if walked++; walked > wideMarks {
					allHeld = true // most of the fleet holds it (see PredictedLatency)
					break
				}
				if r := p.row(num, id); r != nil {
					r.mark = p.gen
				}
			}
		}
	}
	prompt := len(hashes) * tokensPerChunk
	fullK := float64(prompt) / 1000
	heldK := float64(max(prompt-depth*tokensPerChunk, 0)) / 1000
	// The least score wins (see rank); rows are sorted by id, so the first of equal scores
	// is the smallest id.
	best, bestScore := -1, uint64(math.MaxUint64)
	for i := range p.rows {
		r := &p.rows[i]
		if r.load >= limit || (len(exclude) > 0 && excluded(r.m.ID, exclude)) {
			continue
		}
		held, k := false, fullK
		if depth > 0 && (allHeld || r.mark == p.gen) {
			held, k = true, heldK
		}
		if s := rank(ttftmodel.PredictWith(r.w, ttftmodel.X{1, float64(r.load), k}), slo, held, r.load); s < bestScore {
			best, bestScore = i, s
		}
	}
	if best < 0 {
		return nil, ReasonPredicted // every member under the cap is excluded, and so is the rest
	}
	b := &p.rows[best]
	p.meets = slo <= 0 || bestScore>>63 == 0
	if !p.meets {
		p.idle = p.meetsIdle(slo, depth, allHeld, fullK, heldK, exclude)
	}
	bestMatched := 0
	if depth > 0 && (allHeld || b.mark == p.gen) {
		bestMatched = depth
	}
	k := fullK
	if bestMatched > 0 {
		k = heldK
		p.warm, p.warmHeld = lastPrefix{m: b.m, depth: bestMatched, hashes: hashes}, held
		if held == nil {
			p.warmIdx = idx
		}
	}
	p.last = ttftmodel.X{1, float64(b.load), k}
	return b.m, ReasonPredicted
}

// Warm implements Warmer, over the index the last pick read.
func (p *PredictedLatency) Warm(minChunks, slack int, exclude []string) (*Member, int, uint64) {
	last, held, idx := p.warm, p.warmHeld, p.warmIdx
	p.warm, p.warmHeld, p.warmIdx = lastPrefix{}, nil, nil
	id, ok := last.warmDepth(minChunks, slack)
	if !ok || !p.contains(last.m) {
		return nil, 0, 0
	}
	limit := p.Cap()
	if last.m.load < limit {
		return nil, 0, 0 // a holder under the cap: the walk below would find it
	}
	under := func(m *Member) bool { return m != nil && p.contains(m) && m.load < limit }
	var holds func(*Member) bool
	if held != nil {
		hs := held.Holders(id)
		if len(hs) > wideHolders || slices.ContainsFunc(hs, under) {
			return nil, 0, 0
		}
		holds = func(m *Member) bool { return held.Holds(m, id) }
	} else {
		hs, n := idx.Holders(id), 0
		for w, ok := hs.Next(); ok; w, ok = hs.Next() {
			if n++; n > wideHolders || under(p.byID[w]) {
				return nil, 0, 0
			}
		}
		holds = func(m *Member) bool { return idx.Holds(m.ID, id) }
	}
	// The least loaded member not excluded, the smallest id among equals (the rows are in id
	// order).
	var t *latRow
	for i := range p.rows {
		r := &p.rows[i]
		if (t == nil || r.load < t.load) && !(len(exclude) > 0 && excluded(r.m.ID, exclude)) {
			t = r
		}
	}
	if t == nil || t.load+1 >= limit || holds(t.m) { // (never the picked member: it is at the cap)
		return nil, 0, 0
	}
	return t.m, last.depth, id
}

// rank packs a candidate's place in the pick's order into one number, the least first:
//
//	meets the objective: 0 | not held << 40 | load
//	otherwise:           1 << 63 | bucket << 41 | not held << 40 | load
//
// where bucket is the prediction in TieMs (below 2²² = 4,194,304 ms, since a prediction is
// at most ttftmodel.MaxMs) and the load is clamped to [0, 2⁴⁰): loads that high tie. Held is
// whether the candidate holds the prompt's deepest cached chunk (its matched depth is that
// depth, or 0).
func rank(pred, slo float64, held bool, load int64) uint64 {
	s := uint64(min(max(load, 0), 1<<40-1))
	if !held {
		s |= 1 << 40
	}
	if slo > 0 && pred <= slo {
		return s
	}
	return s | 1<<63 | uint64(int64(pred/TieMs))<<41
}

// meetsIdle reports whether a member not excluded (under the cap or not) would be predicted to
// meet slo at no load: a second pass, made only when the pick's member misses its objective.
func (p *PredictedLatency) meetsIdle(slo float64, depth int, allHeld bool, fullK, heldK float64, exclude []string) bool {
	for i := range p.rows {
		r := &p.rows[i]
		if len(exclude) > 0 && excluded(r.m.ID, exclude) {
			continue
		}
		k := fullK
		if depth > 0 && (allHeld || r.mark == p.gen) {
			k = heldK
		}
		if ttftmodel.PredictWith(r.w, ttftmodel.X{1, 0, k}) <= slo {
			return true
		}
	}
	return false
}

// row returns the row of the index's worker num (id), or nil when it is not a member.
func (p *PredictedLatency) row(num int32, id string) *latRow {
	if int(num) < len(p.nums) {
		if i := p.nums[num] - 1; i >= 0 && int(i) < len(p.rows) && p.rows[i].m.ID == id {
			return &p.rows[i]
		}
	}
	m := p.byID[id]
	if m == nil {
		return nil
	}
	if int(num) >= len(p.nums) {
		p.nums = append(p.nums, make([]int32, int(num)+1-len(p.nums))...)
	}
	p.nums[num] = m.row + 1
	return &p.rows[m.row]
}

// deepestHeld is deepest over the exact index: the deepest depth whose chunk a candidate's
// engine reports it holds (0: none).
func (p *PredictedLatency) deepestHeld(x *HeldIndex, hashes []uint64, limit int64, exclude []string) int {
	lo, hi := 0, len(hashes)
	for lo < hi {
		mid := int(uint(lo+hi+1) >> 1)
		if slices.ContainsFunc(x.Holders(hashes[mid-1]), func(m *Member) bool {
			return p.contains(m) && m.load < limit && !(len(exclude) > 0 && excluded(m.ID, exclude))
		}) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// deepest is the deepest depth whose chunk a candidate holds (0: none), as PrefixAware's.
func (p *PredictedLatency) deepest(x *prefixindex.Index, hashes []uint64, limit int64, exclude []string) int {
	lo, hi := 0, len(hashes)
	for lo < hi {
		mid := int(uint(lo+hi+1) >> 1)
		if p.anyHeld(x, hashes[mid-1], limit, exclude) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

func (p *PredictedLatency) anyHeld(x *prefixindex.Index, h uint64, limit int64, exclude []string) bool {
	hs := x.Holders(h)
	for num, id, ok := hs.NextNum(); ok; num, id, ok = hs.NextNum() {
		if r := p.row(num, id); r != nil && r.load < limit && !(len(exclude) > 0 && excluded(id, exclude)) {
			return true
		}
	}
	return false
}
