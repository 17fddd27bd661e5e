package request_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/request"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// barrier, sent to the spy, is closed once every message the spy got before it is recorded.
type barrier chan struct{}

// observeRig is a rig whose request actors reach the router through a spy that records the
// ObservedTTFT messages they send. The returned function records what the spy has seen so far:
// it waits for the spy to handle everything sent to it before the call (a request actor sends
// its observation before it answers, so after an answer the observation is in the spy's
// mailbox).
func observeRig(t *testing.T, observe bool) (*rig, func() []*router.ObservedTTFT) {
	var mu sync.Mutex
	var seen []*router.ObservedTTFT
	var spyPID *actor.PID
	var root *actor.RootContext
	r := newRig(t, rigOpt{deps: func(d *request.Deps, h *gwtest.Harness) {
		d.ObserveTTFT = observe
		real := d.Router
		spy, err := h.GW.System.Root.SpawnNamed(actor.PropsFromFunc(func(c actor.Context) {
			switch m := c.Message().(type) {
			case barrier:
				close(m)
				return
			case *router.ObservedTTFT:
				mu.Lock()
				seen = append(seen, m)
				mu.Unlock()
			case actor.SystemMessage, actor.AutoReceiveMessage:
				return
			}
			c.Forward(real)
		}), fmt.Sprintf("router-spy-%v", observe))
		if err != nil {
			t.Fatal(err)
		}
		d.Router, spyPID, root = spy, spy, h.GW.System.Root
	}})
	return r, func() []*router.ObservedTTFT {
		b := make(barrier)
		root.Send(spyPID, b)
		select {
		case <-b:
		case <-time.After(5 * time.Second):
			t.Fatal("the spy did not handle a barrier in 5 s")
		}
		mu.Lock()
		defer mu.Unlock()
		return append([]*router.ObservedTTFT(nil), seen...)
	}
}

// TestObservedTTFTReachesRouter: with Deps.ObserveTTFT (route_policy = "predicted_latency")
// a streamed request's attempt reports its TTFT and its pick's features for the worker that
// answered, naming its registration (the router learns it only for that registration); a
// non-streamed one reports nothing (its first byte is its whole answer), and without the flag
// nothing is sent.
func TestObservedTTFTReachesRouter(t *testing.T) {
	for _, observe := range []bool{true, false} {
		r, seen := observeRig(t, observe)
		e := r.engine(t, "w1", func(w http.ResponseWriter, req *http.Request, body string) {
			if !strings.Contains(body, `"stream":true`) {
				completion(w, []string{"hi"}, []float64{-0.1})
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"hi\"}]}\n\ndata: [DONE]\n\n")
		})
		r.beat("w1", "smol", e.URL, 0)
		if resp, body := r.post(t, "/v1/completions", "", `{"model":"smol","prompt":"hello"}`); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		if n := len(seen()); n != 0 {
			t.Fatalf("a non-streamed request sent %d observations", n)
		}
		resp, body := r.post(t, "/v1/completions", "", `{"model":"smol","prompt":"hello","stream":true}`)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		got := seen()
		if !observe {
			if len(got) != 0 {
				t.Fatalf("without the flag: %d observations sent", len(got))
			}
			continue
		}
		if len(got) != 1 || got[0].WorkerID != "w1" || got[0].Reg != 1 || got[0].TTFT <= 0 {
			t.Fatalf("observations %+v, want one for w1's registration 1 with a positive TTFT", got)
		}
	}
}
