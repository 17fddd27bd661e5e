package fleet

import (
	"fmt"
	"math/rand/v2"
	"strconv"
)

// Traces are sequences of chat requests, generated from a seed before the run (the same for
// every policy) and independent of routing. A request's prompt is its session's messages so
// far; a message is a segment of tokens named by a 64-bit id, whose tokens are a pure
// function of (seed, id, position) (segmentTokens), so nothing but the shapes is stored and two
// requests share a prompt prefix exactly when they share leading messages.
//
//   - shared-prefix: single-turn chat; each request is one of G long system prompts (2,048 to
//     4,096 tokens; G = 2 per worker, a working set larger than one engine's KV cache but
//     well within the fleet's), then its own user message (64 to 512) and answer (32 to 256).
//   - multi-turn: conversations (2 to 12 turns) under one of 16 short system prompts (256 to
//     1,024 tokens); each turn adds a user message (32 to 256) to everything said so far, and
//     its answer (64 to 384) is part of the next turn's prompt. 8 conversations per worker are
//     open at once; each arrival is the next turn of one of them, drawn at random.
//   - agentic: tool loops (10 to 40 turns) under one of 8 agent prompts with tool definitions
//     (4,096 to 8,192 tokens); each turn adds a tool result (128 to 1,024) and a short action
//     (16 to 96); a loop stops before its context passes 12,288 tokens. 4 loops per worker
//     are open at once.
//   - no-sharing: single-turn requests with unique prompts (512 to 3,072 tokens) and answers
//     (32 to 256): the control, where no policy can find a cached prefix.
//   - lora: shared-prefix's single-turn shape over K LoRA adapters (R21): each request names
//     an adapter, drawn with Zipf popularity (adapter k, from 0, with probability ∝
//     (k+1)^-LoRAZipfS: at K = 50 the first takes 26% of the requests, the first five 56%,
//     the last 0.35%), then one of that adapter's 2 system prompts (2,048 to 4,096 tokens: an
//     adapter's task prompts, so prompts of two adapters share no prefix, as vLLM's prefix
//     cache keys blocks by adapter), its own user message (64 to 512) and answer (32 to 256).
type trace struct {
	reqs     []request
	adapters []string // the lora trace's adapter names, sorted (index = request.lora-1)
}

// Trace names (R18.1).
const (
	TraceSharedPrefix = "shared-prefix"
	TraceMultiTurn    = "multi-turn"
	TraceAgentic      = "agentic"
	TraceNoSharing    = "no-sharing"
	TraceLoRA         = "lora"
)

// Traces lists the trace names.
var Traces = []string{TraceSharedPrefix, TraceMultiTurn, TraceAgentic, TraceNoSharing, TraceLoRA}

// LoRAZipfS is the exponent of the lora trace's adapter popularity: 1.1, a little more skewed
// than Zipf's law (1), as the few adapters of a multi-tenant fleet's main products take most
// of its traffic over a long tail.
const LoRAZipfS = 1.1

// loraPrompts is the system prompts per adapter of the lora trace.
const loraPrompts = 2

type role uint8

const (
	roleSystem role = iota
	roleUser
	roleAssistant
)

var roleNames = [...]string{"system", "user", "assistant"}

// message is one chat message: n tokens of segment seg.
type message struct {
	role role
	seg  uint64
	n    int32
}

// request is one chat request: the prompt msgs (a prefix of its session's messages) and the
// answer the engine produces (out, a segment: the next turn's prompt holds the same tokens).
type request struct {
	msgs []message
	out  message
	lora int32 // 1 + the index of the adapter it names (lora trace); 0: the base model
}

func (r *request) promptTokens() int {
	n := 0
	for _, m := range r.msgs {
		n += int(m.n)
	}
	return n
}

// Segment id spaces: the kind in the top byte.
const (
	segSystem = iota + 1
	segUser
	segAnswer
)

func segID(kind, a, b uint64) uint64 { return kind<<56 | a<<24 | b }

func between(r *rand.Rand, lo, hi int) int32 { return int32(lo + r.IntN(hi-lo+1)) }

// genTrace builds trace name of n requests for a fleet of workers (and adapters, the lora
// trace's K).
func genTrace(name string, n, workers, adapters int, seed uint64) (*trace, error) {
	r := rand.New(rand.NewPCG(seed, 0x7472616365)) // "trace"
	t := &trace{reqs: make([]request, 0, n)}
	switch name {
	case TraceLoRA:
		if adapters < 1 {
			return nil, fmt.Errorf("the lora trace needs at least 1 adapter, got %d", adapters)
		}
		width := len(strconv.Itoa(adapters - 1))
		t.adapters = make([]string, adapters)
		for a := range t.adapters {
			t.adapters[a] = fmt.Sprintf("%s-lora-%0*d", model, width, a) // zero-padded: sorted by index
		}
		sys := make([]message, adapters*loraPrompts)
		for g := range sys {
			sys[g] = message{role: roleSystem, seg: segID(segSystem, uint64(g), 0), n: between(r, 2048, 4096)}
		}
		zipf := rand.NewZipf(r, LoRAZipfS, 1, uint64(adapters-1))
		for i := range n {
			a := int(zipf.Uint64())
			u := message{role: roleUser, seg: segID(segUser, uint64(i), 0), n: between(r, 64, 512)}
			t.reqs = append(t.reqs, request{msgs: []message{sys[a*loraPrompts+r.IntN(loraPrompts)], u}, lora: int32(a + 1),
				out: message{role: roleAssistant, seg: segID(segAnswer, uint64(i), 0), n: between(r, 32, 256)}})
		}
	case TraceSharedPrefix, TraceNoSharing:
		groups := 2 * workers
		sys := make([]message, groups)
		for g := range sys {
			sys[g] = message{role: roleSystem, seg: segID(segSystem, uint64(g), 0), n: between(r, 2048, 4096)}
		}
		for i := range n {
			u := message{role: roleUser, seg: segID(segUser, uint64(i), 0)}
			var msgs []message
			if name == TraceSharedPrefix {
				u.n = between(r, 64, 512)
				msgs = []message{sys[r.IntN(groups)], u}
			} else {
				u.n = between(r, 512, 3072)
				msgs = []message{u}
			}
			t.reqs = append(t.reqs, request{msgs: msgs,
				out: message{role: roleAssistant, seg: segID(segAnswer, uint64(i), 0), n: between(r, 32, 256)}})
		}
	case TraceMultiTurn, TraceAgentic:
		agentic := name == TraceAgentic
		nsys, open := 16, 8*workers
		sysLo, sysHi := 256, 1024
		if agentic {
			nsys, open, sysLo, sysHi = 8, 4*workers, 4096, 8192
		}
		sys := make([]message, nsys)
		for g := range sys {
			sys[g] = message{role: roleSystem, seg: segID(segSystem, uint64(g), 0), n: between(r, sysLo, sysHi)}
		}
		type session struct {
			id    uint64
			msgs  []message // the conversation so far
			turns int       // turns left
		}
		next := uint64(0)
		newSession := func() *session {
			next++
			s := &session{id: next, msgs: []message{sys[r.IntN(nsys)]}, turns: int(between(r, 2, 12))}
			if agentic {
				s.turns = int(between(r, 10, 40))
			}
			s.msgs = append(make([]message, 0, 2*s.turns+1), s.msgs...)
			return s
		}
		sessions := make([]*session, open)
		for i := range sessions {
			sessions[i] = newSession()
		}
		for range n {
			k := r.IntN(open)
			s := sessions[k]
			id := s.id
			turn := uint64(len(s.msgs) / 2)
			u := message{role: roleUser, seg: segID(segUser, id, turn)}
			a := message{role: roleAssistant, seg: segID(segAnswer, id, turn)}
			if agentic {
				u.n, a.n = between(r, 128, 1024), between(r, 16, 96)
			} else {
				u.n, a.n = between(r, 32, 256), between(r, 64, 384)
			}
			s.msgs = append(s.msgs, u)
			t.reqs = append(t.reqs, request{msgs: s.msgs[:len(s.msgs):len(s.msgs)], out: a})
			s.msgs = append(s.msgs, a)
			s.turns--
			ctx := 0
			for _, m := range s.msgs {
				ctx += int(m.n)
			}
			if s.turns == 0 || (agentic && ctx+1024+96 > 12288) {
				sessions[k] = newSession()
			}
		}
	default:
		return nil, fmt.Errorf("unknown trace %q (known: %v)", name, Traces)
	}
	return t, nil
}

// vocab is the number of token ids: each renders as 3 base-62 characters and a space, so a
// 64-byte chunk of a rendered prompt is about 16 tokens, one KV block.
const vocab = 62 * 62 * 62

const base62 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// appendTokens appends message m's tokens under seed.
func appendTokens(dst []uint32, seed uint64, m message) []uint32 {
	base := splitmix(seed ^ splitmix(m.seg))
	for i := range uint64(m.n) {
		dst = append(dst, uint32(splitmix(base+i)%vocab))
	}
	return dst
}

// appendContent appends message m's text: each token as 3 base-62 characters and a space.
func appendContent(dst []byte, seed uint64, m message) []byte {
	base := splitmix(seed ^ splitmix(m.seg))
	for i := range uint64(m.n) {
		t := splitmix(base+i) % vocab
		dst = append(dst, base62[t/(62*62)], base62[t/62%62], base62[t%62], ' ')
	}
	return dst
}
