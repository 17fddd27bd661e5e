package router

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/internal/prefixindex"
)

// simScenario plays one scenario through a pick function and a release function and returns
// the workers picked: 4 workers of two KV sizes, prompts sharing prefixes, releases in between.
func simScenario(t *testing.T, join func(id string, queue, kv int64), pick func(i int, hashes []uint64, key uint64) *Picked,
	release func(*Picked)) []string {
	t.Helper()
	for i, id := range []string{"w3", "w1", "w0", "w2"} {
		join(id, int64(i%2), int64(512*(1+i%2)))
	}
	sys := []byte(fmt.Sprintf("%0256d", 7))
	var got []string
	var held []*Picked
	for i := range 40 {
		prompt := append(slices.Clone(sys[:64*(1+i%4)]), fmt.Sprintf("%064d", i%5)...)
		hashes := prefixindex.Hashes(nil, prompt)
		p := pick(i, hashes, uint64(i%5)*0x9e3779b97f4a7c15)
		if p.Err != nil {
			t.Fatalf("pick %d: %v", i, p.Err)
		}
		got = append(got, p.WorkerID)
		held = append(held, p)
		if i%3 == 2 {
			release(held[0])
			held = held[1:]
		}
		if i == 20 {
			join("w1", 5, 512) // a heartbeat with a longer queue
		}
	}
	return got
}

// TestSimPicksAsTheRig: the exported driver picks exactly what the test rig (the router's
// own harness) picks, for every policy, with the prefix index on.
func TestSimPicksAsTheRig(t *testing.T) {
	for _, pol := range []string{"least_outstanding", "weighted", "affinity", "prefix_aware", "round_robin"} {
		t.Run(pol, func(t *testing.T) {
			cfg := Config{Policy: pol, LoadFactor: 1.25, PrefixIndexBlocks: 64}
			r := newRig(t, cfg)
			me := actor.NewPID("local", "req/sim")
			want := simScenario(t,
				func(id string, queue, kv int64) {
					r.joinWith(id, "m", RoleUnified, queue, func(i *WorkerInfo) { i.KVTotalBlocks, i.KVFreeBlocks = kv, kv })
				},
				func(i int, hashes []uint64, key uint64) *Picked {
					r.deliver(me, &Pick{Model: "m", RequestID: fmt.Sprint(i), Key: uint64(i + 1), PrefixHash: key, PrefixHashes: hashes})
					as := r.inbox[me.Id]
					delete(r.inbox, me.Id)
					if len(as) != 1 {
						t.Fatalf("rig: %d answers", len(as))
					}
					return as[0].(*Picked)
				},
				func(p *Picked) { r.send(p.Worker, &Release{Ticket: p.Ticket}) })

			s, err := NewSim(cfg)
			if err != nil {
				t.Fatal(err)
			}
			got := simScenario(t,
				func(id string, queue, kv int64) {
					s.SetWorker(WorkerInfo{ID: id, Model: "m", HTTPAddress: "127.0.0.1:9", QueueDepth: queue,
						KVTotalBlocks: kv, KVFreeBlocks: kv})
				},
				func(i int, hashes []uint64, key uint64) *Picked {
					p, ok := s.Pick(&Pick{Model: "m", RequestID: fmt.Sprint(i), Key: uint64(i + 1), PrefixHash: key, PrefixHashes: hashes})
					if !ok {
						t.Fatal("sim: queued without admission")
					}
					return p
				},
				func(p *Picked) { s.Release(p, OutcomeSuccess) })
			if !slices.Equal(got, want) {
				t.Fatalf("sim picked %v\nrig picked %v", got, want)
			}
			for _, id := range []string{"w0", "w1", "w2", "w3"} {
				if s.InFlight(id) != r.inFlight(id) {
					t.Fatalf("%s: sim in flight %d, rig %d", id, s.InFlight(id), r.inFlight(id))
				}
			}
		})
	}
}

// TestSimAdmission: with the admission queue on, a pick past the busy threshold waits and is
// dispatched when a release frees room; the queue's max wait fires on the Sim's clock.
func TestSimAdmission(t *testing.T) {
	s, err := NewSim(Config{Policy: "least_outstanding", Admission: admissionCfg(admission.Policy(nil), 1)})
	if err != nil {
		t.Fatal(err)
	}
	s.SetWorker(WorkerInfo{ID: "w0", Model: "m", KVTotalBlocks: 16, KVFreeBlocks: 16})
	req := func(n int) (*actor.PID, *Pick) {
		pid := actor.NewPID("sim", fmt.Sprint("req/", n))
		return pid, &Pick{Model: "m", RequestID: fmt.Sprint(n), Key: uint64(n), Requester: pid, Tag: 1, Admit: &AdmitInfo{}}
	}
	_, p1 := req(1)
	first, ok := s.Pick(p1)
	if !ok || first.Err != nil || first.WorkerID != "w0" {
		t.Fatalf("first pick: %+v %v", first, ok)
	}
	pid2, p2 := req(2)
	if _, ok := s.Pick(p2); ok {
		t.Fatal("second pick went past the busy threshold")
	}
	s.Release(first, OutcomeSuccess)
	s.Finished(&Finished{Key: 1})
	ds := s.Deliveries()
	if len(ds) != 1 || !ds[0].To.Equal(pid2) {
		t.Fatalf("deliveries %v, want the second pick's", ds)
	}
	if pk, ok := ds[0].Msg.(*Picked); !ok || pk.WorkerID != "w0" || !pk.Admitted {
		t.Fatalf("delivered %#v", ds[0].Msg)
	}
	_, p3 := req(3)
	if _, ok := s.Pick(p3); ok {
		t.Fatal("third pick went past the busy threshold")
	}
	s.Advance(29 * time.Second)
	if ds := s.Deliveries(); len(ds) != 0 {
		t.Fatalf("before max wait: %v", ds)
	}
	s.Advance(time.Second)
	if ds := s.Deliveries(); len(ds) != 1 {
		t.Fatalf("at max wait: %d deliveries, want the timeout", len(ds))
	}
	if s.InFlight("nobody") != -1 {
		t.Fatal("unknown worker has a count")
	}
	s.RemoveWorker("w0")
	if s.InFlight("w0") != -1 {
		t.Fatal("removed worker still counted")
	}
}

// TestSimPickAllocations: a pick through Sim allocates what a production pick does (the
// *Picked reply and the worker's *Acquire) plus Sim's own messages for the release (the
// *Release and the worker's *LoadReport); the router's pick path itself adds nothing.
func TestSimPickAllocations(t *testing.T) {
	s, err := NewSim(Config{Policy: "round_robin"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 8 {
		s.SetWorker(WorkerInfo{ID: fmt.Sprint("w", i), Model: "m", KVTotalBlocks: 64, KVFreeBlocks: 64})
	}
	p := &Pick{Model: "m", RequestID: "r", Key: 1}
	allocs := testing.AllocsPerRun(200, func() {
		pk, _ := s.Pick(p)
		s.Release(pk, OutcomeSuccess)
	})
	if allocs > 4 {
		t.Fatalf("a pick and its release allocate %v times, want at most 4", allocs)
	}
}
