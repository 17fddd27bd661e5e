package grpcapi

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
)

// mailboxSink hands each message to one consumer goroutine, as the gateway hands them to the
// router actor's mailbox; the consumer answers the messages that ask and counts the events.
type mailboxSink struct{ box chan *router.KVEvents }

func (m mailboxSink) KVEvents(ev *router.KVEvents) { m.box <- ev }

// BenchmarkKVSubscriber: events per second through one subscription, from a loopback engine
// that sends STORED events of 16 ids back to back to a consumer that applies them one by one.
func BenchmarkKVSubscriber(b *testing.B) {
	f, addr := startFakeKV(b)
	events := []*kvv1.KvEvent{ev(1, kvv1.KvEvent_CLEARED)}
	ids := make([]uint64, 16)
	for k := range uint64(b.N) {
		events = append(events, ev(k+2, kvv1.KvEvent_STORED, ids...))
	}
	f.scripts <- kvScript{events: events}
	box := make(chan *router.KVEvents, 1<<16) // the router's mailbox: unbounded in production
	done := make(chan struct{})
	go func() {
		n := 0
		for ev := range box {
			if ev.Reply != nil {
				ev.Reply <- true
			}
			if len(ev.Stored) > 0 {
				if n++; n == b.N {
					close(done)
				}
			}
		}
	}()
	engines := NewEngines(EnginesOptions{})
	defer engines.Close()
	s := NewKVSubscriber(KVSubscriberOptions{Sink: mailboxSink{box}, Engines: engines,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	b.ResetTimer()
	follow(s, router.WorkerInfo{ID: "e", GRPCAddress: addr, KVEvents: true})
	select {
	case <-done:
	case <-time.After(time.Minute):
		b.Fatal("the events did not all arrive")
	}
	b.StopTimer()
	s.Close()
	close(box)
}
