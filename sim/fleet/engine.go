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
}

func newEngine(id string, m EngineModel) *engine {
	return &engine{id: id, model: m, pool: kv.NewPool(m.KVBlocks, m.BlockSize)}
}

func (e *engine) waiting() int { return len(e.queue) - e.head }

// inFlight is the engine's requests, queued or running: the worker's in-flight count.
func (e *engine) inFlight() int { return e.run + e.waiting() }

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
