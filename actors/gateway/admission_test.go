package gateway_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/gwtest"
)

func admissionConfig(policy admission.Policy, threshold int64) *router.AdmissionConfig {
	return &router.AdmissionConfig{
		Queue: admission.Config{
			Classes:      []admission.ClassConfig{{Name: "default", Quantum: 1, QueueLimit: 10, MaxWait: 5 * time.Second}},
			DefaultClass: "default", Policy: policy, Recheck: time.Second,
		},
		BusyThreshold: threshold, PolicyName: "test",
	}
}

// TestSessionSerialThroughRouter: the router queues a session's second turn until the first
// has Finished; another session is not delayed.
func TestSessionSerialThroughRouter(t *testing.T) {
	h := gwtest.New(t, gwtest.WithAdmission(admissionConfig(admission.NewSessionSerial(), 0)))
	h.Beat(gwtest.Worker("w1", "smol", 0))
	p := h.NewProbe()
	pick := func(id, session string) {
		p.Ask(h.GW.Router, &router.Pick{Model: "smol", RequestID: id, Tag: 1,
			Admit: &router.AdmitInfo{SessionID: session}})
	}
	pick("t1", "alice")
	if m, ok := p.Next().(*router.Picked); !ok || m.Err != nil || !m.Admitted {
		t.Fatalf("first turn: %#v", m)
	}
	pick("t2", "alice")
	if _, ok := p.Next().(*router.Queued); !ok {
		t.Fatal("second turn of the session was not queued")
	}
	pick("b1", "bob")
	if m, ok := p.Next().(*router.Picked); !ok || m.Err != nil {
		t.Fatalf("another session was delayed: %#v", m)
	}
	h.GW.System.Root.Send(h.GW.Router, &router.Finished{RequestID: "t1"})
	if m, ok := p.Next().(*router.Picked); !ok || m.Err != nil || !m.Admitted {
		t.Fatalf("second turn after the first finished: %#v", m)
	}
}

// TestQueueTimeoutAndCancelThroughRouter: a full worker queues; past max_wait the request is
// answered queue_timeout (on the fake clock); a cancelled one leaves at once.
func TestQueueTimeoutAndCancelThroughRouter(t *testing.T) {
	h := gwtest.New(t, gwtest.WithAdmission(admissionConfig(nil, 1)))
	h.Beat(gwtest.Worker("w1", "smol", 1)) // queue depth 1: full at threshold 1
	p := h.NewProbe()
	p.Ask(h.GW.Router, &router.Pick{Model: "smol", RequestID: "a", Tag: 1, Admit: &router.AdmitInfo{}})
	p.Ask(h.GW.Router, &router.Pick{Model: "smol", RequestID: "b", Tag: 1, Admit: &router.AdmitInfo{}})
	for i := 0; i < 2; i++ {
		if _, ok := p.Next().(*router.Queued); !ok {
			t.Fatal("not queued")
		}
	}
	h.GW.System.Root.Send(h.GW.Router, &router.CancelPick{RequestID: "b"})
	h.Eventually("b left the queue", func() bool {
		v, err := h.GW.Queue()
		return err == nil && v.Snapshot.(admission.Snapshot).Classes[0].Queued == 1
	})
	h.Clock.Advance(5*time.Second - time.Nanosecond)
	select {
	case m := <-p.C:
		t.Fatalf("answered before max_wait: %#v", m)
	default:
	}
	h.Clock.Advance(time.Nanosecond)
	m, ok := p.Next().(*router.Picked)
	if !ok || !errors.Is(m.Err, errs.ErrQueueTimeout) {
		t.Fatalf("at max_wait: %#v", m)
	}
}
