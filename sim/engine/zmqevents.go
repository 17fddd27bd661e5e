package engine

import (
	"fmt"
	"hash/fnv"
	"net"
	"net/http"

	"github.com/tlgw/tlgw/internal/vllmkv"
	"github.com/tlgw/tlgw/sim/kv"
	"github.com/tlgw/tlgw/sim/kvpub"
)

// vLLM-format KV events (SPEC R22, ENGINES.md §1): with --kv-events the engine publishes what its
// prefix cache stores and evicts as vLLM does — a ZMQ PUB of msgpack batches on the topic
// kv@<its advertised HTTP address>@<its model> (sim/kvpub) — besides the tl.kv.v1 gRPC stream
// (kvevents.go), which is unchanged.
//
// The events come from the pool (kv.Pool.OnBlocks), whose blocks are named by a chained hash
// seeded with --kv-hash-seed (as a vLLM engine's hashes depend on its own seed), so a consumer
// cannot take them for its own keys: it must key blocks by the token ids a BlockStored carries,
// which are the engine's prompt tokens, the ids its /tokenize and render endpoints answer. Each
// pool call is one batch (more when it is over the decoder's bounds): one BlockRemoved of the
// evicted hashes, then a BlockStored per run of consecutive stored blocks (parent_block_hash
// nil when the run starts the sequence, lora_id nil, medium "GPU"). The batch is numbered and
// queued inside the pool call, under the scheduler's lock, without waiting; encoding and
// sending happen on the publisher's goroutine. seq starts at 0 with AllBlocksCleared, so a
// subscriber of a restarted engine sees its seq go back and forgets what it held.
//
// A gap on demand (tests): POST /tlengine/kv_events/gap (served with --kv-events only) makes
// the next batch skip the live subscribers; it is still retained for the replay endpoint.

// KVEventsConfig is --kv-events and its companions. Addr "" is off.
type KVEventsConfig struct {
	Addr        string // host:port: bound (Bind; "*" host, port 0 allowed) or dialled
	Bind        bool
	Format      vllmkv.Format
	Replay      string // the replay ROUTER's host:port ("" = none)
	ReplayTopic bool   // replay answers carry the topic frame (false: vLLM's [seq, payload])
	// HashSeed seeds the pool's block hashes; 0 derives a nonzero one from the engine's id (so
	// a restarted engine names its blocks as before).
	HashSeed uint64
}

// GapPath is the path that withholds the next KV event batch from live subscribers.
const GapPath = "/tlengine/kv_events/gap"

// kvHashSeed is c's pool seed (nonzero).
func (c *Config) kvHashSeed() uint64 {
	if c.KVEvents.HashSeed != 0 {
		return c.KVEvents.HashSeed
	}
	h := fnv.New64a()
	h.Write([]byte("tlengine kv hash seed:" + c.ID))
	return h.Sum64() | 1
}

func (c *Config) checkKVEvents() error {
	k := &c.KVEvents
	if k.Addr == "" {
		if k.Replay != "" {
			return fmt.Errorf("engine: --kv-replay needs --kv-events")
		}
		return nil
	}
	if err := kvpub.CheckAddr(k.Addr, k.Bind); err != nil {
		return fmt.Errorf("engine: --kv-events: %w", err)
	}
	if k.Replay != "" {
		if err := kvpub.CheckAddr(k.Replay, true); err != nil {
			return fmt.Errorf("engine: --kv-replay: %w", err)
		}
	}
	if c.BlockSize > vllmkv.MaxBlockSize {
		return fmt.Errorf("engine: --kv-events: --block-size %d is over %d, the largest a consumer decodes", c.BlockSize, vllmkv.MaxBlockSize)
	}
	return nil
}

// newPool is the engine's KV pool: seeded when it publishes KV events.
func (c *Config) newPool() *kv.Pool {
	if c.KVEvents.Addr == "" {
		return kv.NewPool(c.KVBlocks, c.BlockSize)
	}
	return kv.NewSeededPool(c.KVBlocks, c.BlockSize, c.kvHashSeed())
}

// startZMQEvents opens the publisher (its addresses known) and hooks it to the pool; the first
// batch is AllBlocksCleared. It runs before anything is served.
func (e *Engine) startZMQEvents() error {
	k := e.cfg.KVEvents
	if k.Addr == "" {
		return nil
	}
	p, err := kvpub.Start(kvpub.Options{Addr: k.Addr, Bind: k.Bind, Topic: vllmkv.FormatTopic(e.advertisedHTTP, e.cfg.Model),
		Format: k.Format, Replay: k.Replay, ReplayTopic: k.ReplayTopic, Clock: e.cfg.Clock, Logger: e.log.With("component", "kv_events_zmq")})
	if err != nil {
		return fmt.Errorf("engine: %w", err)
	}
	e.zpub = p
	p.Publish([]vllmkv.Event{{Kind: vllmkv.AllBlocksCleared}})
	bs := e.cfg.BlockSize
	e.sched.pool.OnBlocks(func(ev kv.BlockEvents) {
		for _, b := range blockBatches(ev, bs) {
			p.Publish(b)
		}
	})
	return nil
}

// KVEventsEndpoint is what heartbeats advertise as kv_events_endpoint: the bound PUB (and
// replay ROUTER) on the advertised HTTP address's host; "" when the engine connects or
// publishes nothing.
func (e *Engine) KVEventsEndpoint() string {
	if e.zpub == nil || !e.cfg.KVEvents.Bind {
		return ""
	}
	ep := vllmkv.Endpoint{Events: "tcp://" + e.advertise(e.zpub.EventsAddr())}
	if r := e.zpub.ReplayAddr(); r != "" {
		ep.Replay = "tcp://" + e.advertise(r)
	}
	return ep.String()
}

// KVEventsAddrs are the publisher's addresses as a peer reaches them: the bound PUB's on the
// advertised host (or the address it dials) and the replay ROUTER's ("" when none).
func (e *Engine) KVEventsAddrs() (events, replay string) {
	if e.zpub == nil {
		return "", ""
	}
	events = e.cfg.KVEvents.Addr
	if e.cfg.KVEvents.Bind {
		events = e.advertise(e.zpub.EventsAddr())
	}
	if r := e.zpub.ReplayAddr(); r != "" {
		replay = e.advertise(r)
	}
	return events, replay
}

// advertise puts a bound address's port on the advertised HTTP address's host (a wildcard bind
// is never advertised).
func (e *Engine) advertise(bound string) string {
	host, _, err := net.SplitHostPort(e.advertisedHTTP)
	_, port, perr := net.SplitHostPort(bound)
	if err != nil || perr != nil {
		return bound
	}
	return net.JoinHostPort(host, port)
}

// InjectKVGap makes the next KV event batch skip the live subscribers (kept for replay); it
// reports whether the engine publishes KV events.
func (e *Engine) InjectKVGap() bool {
	if e.zpub == nil {
		return false
	}
	e.zpub.Withhold()
	return true
}

// KVEventStats are the publisher's counters (zero when off).
func (e *Engine) KVEventStats() kvpub.Stats {
	if e.zpub == nil {
		return kvpub.Stats{}
	}
	return e.zpub.Stats()
}

func (e *Engine) serveKVGap(w http.ResponseWriter, _ *http.Request) {
	if !e.InjectKVGap() {
		writeDetail(w, http.StatusNotFound, "Not Found")
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// Decoder bounds a batch must respect (vllmkv's defaults).
const (
	maxEventsPerBatch = vllmkv.DefaultEvents
	maxHashesPerEvent = vllmkv.DefaultHashes
	maxTokensPerBatch = vllmkv.DefaultTokens
)

// blockBatches turns one pool call's events into batches within the decoder's bounds: removals
// first (one BlockRemoved per maxHashesPerEvent hashes), then each stored run, cut into
// BlockStored events of at most maxHashesPerEvent blocks and maxTokensPerBatch tokens (each
// piece's parent is the block before it); a batch holds at most maxEventsPerBatch events and
// maxTokensPerBatch tokens. bs ≤ vllmkv.MaxBlockSize (checked at start).
func blockBatches(ev kv.BlockEvents, bs int) [][]vllmkv.Event {
	var out [][]vllmkv.Event
	var cur []vllmkv.Event
	tokens := 0
	add := func(e vllmkv.Event) {
		if len(cur) > 0 && (len(cur) == maxEventsPerBatch || tokens+len(e.Tokens) > maxTokensPerBatch) {
			out, cur, tokens = append(out, cur), nil, 0
		}
		cur = append(cur, e)
		tokens += len(e.Tokens)
	}
	for r := ev.Removed; len(r) > 0; {
		n := min(len(r), maxHashesPerEvent)
		add(vllmkv.Event{Kind: vllmkv.BlockRemoved, Hashes: r[:n], Medium: "GPU"})
		r = r[n:]
	}
	perEvent := min(maxHashesPerEvent, max(1, maxTokensPerBatch/bs))
	for _, run := range ev.Stored {
		parent := run.Parent
		for i := 0; i < len(run.Hashes); i += perEvent {
			j := min(len(run.Hashes), i+perEvent)
			add(vllmkv.Event{Kind: vllmkv.BlockStored, Hashes: run.Hashes[i:j], Parent: parent, HasParent: parent != 0,
				Tokens: run.Tokens[i*bs : j*bs], BlockSize: bs, Medium: "GPU"})
			parent = run.Hashes[j-1]
		}
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}
