package fleet

import (
	"errors"
	"time"

	"github.com/tlgw/tlgw/sim/kv"
)

// EngineModel is one engine's timing and memory, the model of sim/engine (tlengine): a FIFO
// queue in front of at most MaxRunning running requests; a request runs once its prompt's KV
// blocks can be allocated from a kv.Pool of KVBlocks blocks of BlockSize tokens (with its
// prefix cache), then its first token comes after PrefillPerToken per uncached prompt token and
// it ends DecodePerToken per output token later. Running requests do not slow each other.
type EngineModel struct {
	KVBlocks        int
	BlockSize       int
	MaxRunning      int
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
}

// DefaultEngine is the engine of a default fleet.
var DefaultEngine = EngineModel{KVBlocks: 2048, BlockSize: 16, MaxRunning: 16,
	PrefillPerToken: 100 * time.Microsecond, DecodePerToken: 10 * time.Millisecond}

// scaled is m with speed × the throughput and mem × the KV blocks (a heterogeneous fleet).
func (m EngineModel) scaled(speed, mem float64) EngineModel {
	m.KVBlocks = max(int(float64(m.KVBlocks)*mem), 1)
	m.PrefillPerToken = time.Duration(float64(m.PrefillPerToken) / speed)
	m.DecodePerToken = time.Duration(float64(m.DecodePerToken) / speed)
	return m
}

// engine is one simulated engine. Its scheduler is sim/engine's (scheduler.go), made
// synchronous: admit runs a request at once when a slot is free, nobody queues and its KV
// fits, else queues it; a release lets the queue's head run while slots and KV allow.
type engine struct {
	id    string
	model EngineModel
	pool  *kv.Pool
	run   int     // running requests
	queue []int32 // waiting jobs, FIFO from head
	head  int
	// precise_prefix (precise.go): ids the pool stopped holding, not yet reported; the hit
	// counters of pools a restart replaced.
	removed         []uint64
	oldHit, oldLook uint64
	// vk is its vLLM-format event publisher and their subscriber (vllm.go; nil on the tl path).
	vk *vllmKV
	// lora is its adapters' GPU slots (nil on a trace without adapters).
	lora *loraSlots
}

func newEngine(id string, m EngineModel) *engine {
	return &engine{id: id, model: m, pool: kv.NewPool(m.KVBlocks, m.BlockSize)}
}

func (e *engine) waiting() int { return len(e.queue) - e.head }

// loraWaiting is the engine's requests waiting for their adapter's slot.
func (e *engine) loraWaiting() int {
	if e.lora == nil {
		return 0
	}
	return len(e.lora.waiting)
}

// queued is the engine's requests that do not run yet (its reported queue depth): those
// waiting for a running slot or their KV, and those waiting for their adapter's slot.
func (e *engine) queued() int { return e.waiting() + e.loraWaiting() }

// inFlight is the engine's requests, queued or running: the worker's in-flight count.
func (e *engine) inFlight() int { return e.run + e.queued() }

// fits reports whether a prompt of n tokens can ever be allocated (sim/engine's errTooLong).
func (e *engine) fits(n int) bool {
	return (n+e.model.BlockSize)/e.model.BlockSize <= e.model.KVBlocks
}

// tryStart allocates the prompt's KV if a slot is free; ok false when it must wait.
func (e *engine) tryStart(prompt []uint32) (*kv.Seq, int, bool) {
	if e.run >= e.model.MaxRunning {
		return nil, 0, false
	}
	seq, cached, err := e.pool.Allocate(prompt)
	if errors.Is(err, kv.ErrNoSpace) {
		return nil, 0, false
	}
	if err != nil {
		panic(err) // Allocate fails only for lack of space
	}
	e.run++
	return seq, cached, true
}

// finish ends a running sequence of pool (the engine's, or the one a restart replaced): its
// answer's tokens join its KV (so the next turn of a conversation finds them cached, as
// tlengine's appends register full blocks), then it is freed.
func (e *engine) finish(pool *kv.Pool, seq *kv.Seq, answer []uint32) {
	for _, t := range answer {
		if seq.Append(t) != nil {
			break // the pool is full: tlengine stops the answer here ("length")
		}
	}
	pool.Free(seq)
	e.run--
}

// loraSlots is an engine's GPU slots for LoRA adapters, sim/engine's rule (lora.go) made
// synchronous: an adapter's requests run only while it holds one of max slots. A request whose
// adapter holds a slot counts one more running there; else it takes a free slot, or else the
// least recently used slot with no running request (ties to the smaller adapter), and pays a
// swap (loading the adapter); while every slot's adapter has running requests it waits, and
// each release lets the waiters go in order while they can. Adapters are numbered 0 to K-1.
//
// Worked example, max 2: a runs (a swap), b runs (a swap), c waits; b's request ends, b is
// idle and least recently used, so c evicts it (a swap) and runs; a's next request runs at
// once (a still holds its slot).
type loraSlots struct {
	max   int
	slots map[int32]*loraSlot // adapter → its slot; at most max entries
	// waiting is the requests (job indexes) whose adapter waits for a slot, in arrival
	// order; bounded by the requests in flight on the engine.
	waiting []int32
	tick    uint64 // the LRU clock: bumped at every release
	swaps   int    // adapters loaded into a slot, ever
}

type loraSlot struct {
	running int
	used    uint64 // tick of its last release
}

func newLoRASlots(max int) *loraSlots {
	return &loraSlots{max: max, slots: make(map[int32]*loraSlot, max)}
}

// place counts a running request of adapter a if a holds a slot or can take one; it reports
// whether it could, and whether a was loaded for it (a swap).
func (l *loraSlots) place(a int32) (ok, swapped bool) {
	if s, ok := l.slots[a]; ok {
		s.running++
		return true, false
	}
	if len(l.slots) >= l.max {
		victim, best := int32(-1), uint64(0)
		for n, s := range l.slots {
			if s.running == 0 && (victim < 0 || s.used < best || s.used == best && n < victim) {
				victim, best = n, s.used
			}
		}
		if victim < 0 {
			return false, false
		}
		delete(l.slots, victim)
	}
	l.slots[a] = &loraSlot{running: 1}
	l.swaps++
	return true, true
}

// release counts one request of adapter a as ended: its slot becomes the most recently used.
func (l *loraSlots) release(a int32) {
	s := l.slots[a]
	s.running--
	l.tick++
	s.used = l.tick
}

// ready takes out of the waiting list, in order, the requests that can run now (each placed,
// as place does) and appends them to dst with whether each swapped; adapterOf names a
// waiting request's adapter.
func (l *loraSlots) ready(dst []loraPlaced, adapterOf func(job int32) int32) []loraPlaced {
	kept := l.waiting[:0]
	for _, j := range l.waiting {
		if ok, swapped := l.place(adapterOf(j)); ok {
			dst = append(dst, loraPlaced{job: j, swapped: swapped})
			continue
		}
		kept = append(kept, j)
	}
	l.waiting = kept
	return dst
}

// loraPlaced is a waiting request that got its adapter's slot.
type loraPlaced struct {
	job     int32
	swapped bool
}
