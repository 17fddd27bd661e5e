package engine

import (
	"context"
	"testing"
	"time"

	"github.com/tlgw/tlgw/sim/kv"
)

// admitted is one queued caller's answer.
type admitted struct {
	name string
	seq  *kv.Seq
	err  error
}

// waitQueued polls until n callers queue (the callers run on their own goroutines).
func waitQueued(t *testing.T, s *scheduler, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for s.status().queued != n {
		if time.Now().After(deadline) {
			t.Fatalf("queued %d, want %d", s.status().queued, n)
		}
		<-tick.C
	}
}

// TestSchedulerNeverRunsMoreThanMax: with two slots, the third request and an adopted KV
// handle wait; each release lets exactly one waiter in, in arrival order, and the running count
// never passes two, also when a release finds several waiters.
func TestSchedulerNeverRunsMoreThanMax(t *testing.T) {
	s := newScheduler(kv.NewPool(64, 4), 2)
	ctx := context.Background()
	prompt := func(k uint32) []uint32 { return []uint32{k, k, k} }
	var running []*kv.Seq
	for k := range uint32(2) {
		seq, _, err := s.admit(ctx, prompt(k), 4)
		if err != nil {
			t.Fatal(err)
		}
		running = append(running, seq)
	}
	out := make(chan admitted, 4)
	for i, name := range []string{"c", "d", "e"} {
		go func() {
			seq, _, err := s.admit(ctx, prompt(uint32(10+i)), 4)
			out <- admitted{name, seq, err}
		}()
		waitQueued(t, s, i+1) // one at a time: their order is the queue's
	}
	held, err := s.importSeq([]uint32{7, 7, 7, 7})
	if err != nil {
		t.Fatal(err)
	}
	go func() { out <- admitted{"adopted", held, s.adopt(ctx, held)} }()
	waitQueued(t, s, 4)

	for _, want := range []string{"c", "d", "e", "adopted"} {
		s.release(running[0])
		running = running[1:]
		if st := s.status(); st.running != 2 {
			t.Fatalf("after a release: %d running, want 2", st.running)
		}
		select {
		case got := <-out:
			if got.name != want || got.err != nil {
				t.Fatalf("admitted %s (%v), want %s", got.name, got.err, want)
			}
			running = append(running, got.seq)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s not admitted after a release", want)
		}
	}
	if st := s.status(); st.queued != 0 || st.running != 2 {
		t.Fatalf("status %+v, want 2 running and none queued", st)
	}
	for _, seq := range running {
		s.release(seq)
	}
	if st := s.status(); st.running != 0 || st.kv.ReferencedBlocks != 0 {
		t.Fatalf("status %+v after every release", st)
	}
}

// TestSchedulerAdoptWaitsForASlot: an adopted KV handle runs at once while a slot is free and
// nobody waits, and queues when every slot is taken; the caller leaving frees its KV.
func TestSchedulerAdoptWaitsForASlot(t *testing.T) {
	s := newScheduler(kv.NewPool(64, 4), 1)
	held, err := s.importSeq([]uint32{1, 2, 3, 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.adopt(context.Background(), held); err != nil || s.status().running != 1 {
		t.Fatalf("adopt with a free slot: %v, %d running", err, s.status().running)
	}
	second, err := s.importSeq([]uint32{5, 6, 7, 8})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.adopt(ctx, second) }()
	waitQueued(t, s, 1)
	if st := s.status(); st.running != 1 {
		t.Fatalf("%d running with one slot", st.running)
	}
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a cancelled adopt succeeded")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a cancelled adopt did not return")
	}
	s.release(held)
	if st := s.status(); st.running != 0 || st.queued != 0 || st.kv.ReferencedBlocks != 0 {
		t.Fatalf("status %+v, want nothing held", st)
	}
}
