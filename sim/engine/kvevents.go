package engine

import (
	"slices"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/prefixindex"
	"github.com/tlgw/tlgw/sim/kv"
	"github.com/tlgw/tlgw/sim/sampler"
)

// KV events (SPEC R18.3): the engine streams what its prefix cache holds as the gateway's chunk
// ids, so that a gateway routes a prompt to the engine that holds its longest prefix without a
// tokenizer.
//
// What an id means. The gateway renders a prompt with oai.RenderPrompt ("role\ncontent\n" per
// chat message, the prompt itself for completions) and cuts it with prefixindex.Hashes into
// 64-byte chunks, chunk c's id chaining every byte before it. The engine renders the same body
// its own way (sampler.RenderChat: "<|role|>\ncontent\n" per message, then "<|assistant|>\n")
// and tokenizes that text. Every byte of the gateway's render is a byte of the engine's (a
// segment maps each message's role, its newline and its content), so chunk c's last byte sits
// in exactly one engine prompt token; the KV block holding that token (and, the blocks being
// chained, every block before it) covers the whole chunk. When an HTTP request's prompt has
// been admitted and prefilled (its full blocks are in the prefix cache), each chunk id is
// attached (kv.Pool.Tag) to the block holding its last byte's token, if that block is a cached
// one (a partial last block is not: that chunk is not reported). An id is STORED when the first
// cached block carries it and REMOVED when the last one carrying it is evicted (one REMOVED per
// pool call, however many blocks it evicted). Worked example, 16-token blocks: a 47-token prompt
// of 128 bytes (two chunks) whose chunk 0 ends in token 30 and chunk 1 in token 46 stores
// chunk 0 only (token 46 is in the partial block 2); a 48-token prompt extending it fills
// block 2 and stores chunk 1.
//
// Conservative by design: only chunks on which both renders agree byte for byte are reported (a
// prefix of the request's ids), so a body the two parsers read differently reports less, never a
// wrong id. Not reported: KV computed by EngineControl.Prefill (it carries token ids, not the
// body), generated tokens, and a prompt whose client left during its prefill (its blocks count
// once a later request matches them). One case over-reports: when a shallower block of a chain
// is evicted while a deeper one stays cached (possible only when two sequences filled the same
// block concurrently, one copy staying private), the deeper block's ids stay held until it is
// evicted; the engine's lookups stop at the gap until the shallower block is computed again.
//
// Sequence numbers. One counter per engine numbers the live events, +1 per event. A stream
// starts with CLEARED at the counter's current value s, then the snapshot (STORED of every held
// id, ≤ 4096 per event) as s+1 … s+k, then every live event numbered n as n+k: consecutive on
// the stream. A subscriber holds at most kvSubBuffer undelivered live events; one that falls
// further behind is cut (ResourceExhausted) and resubscribes for a fresh snapshot; publishing
// never waits for a subscriber.

const (
	maxIDsPerEvent   = 4096 // kv.proto: at most 4096 ids per event
	maxKVSubscribers = 16
	kvSubBuffer      = 1024
)

// kvEvents is the engine's event counter and its subscribers. Events are published under the
// scheduler's lock (so their order is the pool's), and the hub's own lock is taken inside it.
type kvEvents struct {
	mu   sync.Mutex
	seq  uint64 // the last live event's number
	subs map[*kvSub]struct{}
}

type kvSub struct {
	ch      chan *kvv1.KvEvent // live events, numbered by the engine's counter
	off     uint64             // snapshot events sent before them: stream seq = seq + off
	dropped chan struct{}      // closed when the subscriber fell behind
}

func newKVEvents() *kvEvents { return &kvEvents{subs: make(map[*kvSub]struct{})} }

// publish numbers and fans out ids as events of kind, 4096 ids at most each. It never blocks:
// a subscriber whose buffer is full is dropped. It keeps ids (shared by the subscribers).
func (h *kvEvents) publish(kind kvv1.KvEvent_Kind, ids []uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for len(ids) > 0 {
		n := min(len(ids), maxIDsPerEvent)
		h.seq++
		ev := &kvv1.KvEvent{Seq: h.seq, Kind: kind, BlockIds: ids[:n:n]}
		for sub := range h.subs {
			select {
			case sub.ch <- ev:
			default:
				delete(h.subs, sub)
				close(sub.dropped)
			}
		}
		ids = ids[n:]
	}
}

// subscribe registers a subscriber and returns the events that start its stream: CLEARED and
// the snapshot of held. The caller holds the scheduler's lock, so nothing is published between
// reading held and registering.
func (h *kvEvents) subscribe(held []uint64) (*kvSub, []*kvv1.KvEvent, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) >= maxKVSubscribers {
		return nil, nil, status.Errorf(codes.ResourceExhausted, "KvEvents: %d subscribers already", maxKVSubscribers)
	}
	snap := []*kvv1.KvEvent{{Seq: h.seq, Kind: kvv1.KvEvent_CLEARED}}
	for len(held) > 0 {
		n := min(len(held), maxIDsPerEvent)
		snap = append(snap, &kvv1.KvEvent{Seq: h.seq + uint64(len(snap)), Kind: kvv1.KvEvent_STORED, BlockIds: held[:n:n]})
		held = held[n:]
	}
	sub := &kvSub{ch: make(chan *kvv1.KvEvent, kvSubBuffer), off: uint64(len(snap) - 1), dropped: make(chan struct{})}
	h.subs[sub] = struct{}{}
	return sub, snap, nil
}

func (h *kvEvents) unsubscribe(sub *kvSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, sub)
}

// subscribeKV snapshots the pool's held ids and registers a subscriber, atomically with respect
// to the pool's changes.
func (e *Engine) subscribeKV() (*kvSub, []*kvv1.KvEvent, error) {
	e.sched.mu.Lock()
	defer e.sched.mu.Unlock()
	held := e.sched.pool.Tagged(nil)
	slices.Sort(held)
	return e.kvev.subscribe(held)
}

// kvEventsServer is KvEvents on the gRPC listener (every role).
type kvEventsServer struct {
	kvv1.UnimplementedKvEventsServer
	e *Engine
}

// Subscribe streams CLEARED, the snapshot, then live events until the client leaves, the engine
// stops, or the subscriber falls behind.
func (s kvEventsServer) Subscribe(_ *kvv1.SubscribeRequest, stream kvv1.KvEvents_SubscribeServer) (err error) {
	e := s.e
	defer func() { e.met.grpc("Subscribe", err) }()
	ctx := stream.Context()
	if err := e.faultStatus(ctx); err != nil {
		return err
	}
	sub, snap, err := e.subscribeKV()
	if err != nil {
		return err
	}
	defer e.kvev.unsubscribe(sub)
	for _, ev := range snap {
		if err := stream.Send(ev); err != nil {
			return err
		}
	}
	behind := status.Errorf(codes.ResourceExhausted, "KvEvents: the subscriber fell %d events behind; subscribe again", kvSubBuffer)
	for {
		select { // a dropped subscriber's buffered events are stale: its next stream starts afresh
		case <-sub.dropped:
			return behind
		default:
		}
		select {
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-e.stop:
			return status.Error(codes.Unavailable, "the engine is stopping")
		case <-sub.dropped:
			return behind
		case ev := <-sub.ch:
			if err := stream.Send(&kvv1.KvEvent{Seq: ev.Seq + sub.off, Kind: ev.Kind, BlockIds: ev.BlockIds}); err != nil {
				return err
			}
		}
	}
}

// chunkAt is one of the gateway's chunk ids of a request's prompt and the index of the engine
// prompt token that covers the chunk's last byte.
type chunkAt struct {
	id    uint64
	token int
}

// segment says that render[g:g+n] == text[t:t+n]: the gateway's render and the engine's prompt
// text agree there.
type segment struct{ g, t, n int }

// promptChunks returns the gateway's chunk ids of req's prompt (read from body, the request as
// the engine received it) that lie in the text both renders agree on, each with the engine token
// covering its last byte. prompt is the tokenization of req.prompt.
func promptChunks(req *request, body []byte, prompt []uint32) []chunkAt {
	kind, segs := oai.Completions, []segment{{0, 0, len(req.prompt)}}
	if req.chat {
		kind, segs = oai.Chat, chatSegments(req.msgs)
	}
	render := oai.RenderPrompt(kind, body, len(body))
	if len(render) < prefixindex.ChunkBytes {
		return nil
	}
	// agreed: how many leading bytes of render are mapped into req.prompt unchanged.
	agreed := 0
	for _, s := range segs { // contiguous in render: s.g == agreed
		k := commonPrefix(render[s.g:], req.prompt[s.t:s.t+s.n])
		agreed += k
		if k < s.n {
			break
		}
	}
	ids := prefixindex.Hashes(nil, render[:agreed])
	out := make([]chunkAt, 0, len(ids))
	si, tok, tokEnd := 0, 0, 0
	var buf []byte
	for c, id := range ids {
		last := (c+1)*prefixindex.ChunkBytes - 1
		for segs[si].g+segs[si].n <= last {
			si++
		}
		at := segs[si].t + last - segs[si].g // the text byte of the chunk's last byte
		for ; tok < len(prompt); tok++ {
			buf = sampler.AppendTokenText(buf[:0], prompt[tok])
			if tokEnd+len(buf) > at {
				break
			}
			tokEnd += len(buf)
		}
		if tok == len(prompt) {
			break // not the tokenization of req.prompt: report nothing further
		}
		out = append(out, chunkAt{id: id, token: tok})
	}
	return out
}

// chatSegments maps the gateway's chat render (role "\n" content "\n" per message) into
// sampler.RenderChat's ("<|" role "|>\n" content "\n" per message).
func chatSegments(msgs []sampler.Message) []segment {
	segs := make([]segment, 0, 3*len(msgs))
	g, t := 0, 0
	for _, m := range msgs {
		r, c := len(m.Role), len(m.Content)
		segs = append(segs,
			segment{g, t + 2, r},                 // role
			segment{g + r, t + r + 4, 1},         // the newline after "|>"
			segment{g + r + 1, t + r + 5, c + 1}) // content and its newline
		g += r + c + 2
		t += r + c + 6
	}
	return segs
}

func commonPrefix(a []byte, b string) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// tagChunks attaches a running sequence's chunk ids to the cached blocks holding them and
// publishes the ids that became held.
func (e *Engine) tagChunks(seq *kv.Seq, chunks []chunkAt) {
	if len(chunks) == 0 {
		return
	}
	bs := e.cfg.BlockSize
	ids := make([]uint64, 0, len(chunks))
	var stored []uint64
	s := e.sched
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := 0; i < len(chunks); {
		blk := chunks[i].token / bs
		ids = ids[:0]
		for ; i < len(chunks) && chunks[i].token/bs == blk; i++ {
			ids = append(ids, chunks[i].id)
		}
		stored = s.pool.Tag(seq, blk, ids, stored)
	}
	if len(stored) > 0 {
		e.kvev.publish(kvv1.KvEvent_STORED, stored)
	}
}
