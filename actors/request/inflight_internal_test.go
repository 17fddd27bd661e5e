package request

import (
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// inFlight is route r's tlgw_requests_in_flight.
func (m *mrig) inFlight() float64 {
	return testutil.ToFloat64(m.d.Metrics.inFlight.WithLabelValues("r"))
}

// TestRouteInFlight (R24's history per route): a request counts in its route's in-flight
// gauge from the pick that named the route to its end, whichever way it ends — answered,
// failed over until none is left, no worker, the client gone, the actor crashed — and the
// gauge is back at 0 after each.
func TestRouteInFlight(t *testing.T) {
	t.Run("held while the engine answers", func(t *testing.T) {
		m := newMRig(t)
		at := make(chan string, 1)
		release := make(chan struct{})
		m.pool = []string{"a"}
		m.upstream = func(w string, req *http.Request, _ string) (*http.Response, error) {
			at <- w
			<-release
			return reply(200, "application/json", okJSON), nil
		}
		r := m.start(`{"model":"m","prompt":"hi"}`)
		waitAt(t, at, "a")
		if n := m.inFlight(); n != 1 {
			t.Fatalf("in flight %v while the engine answers, want 1", n)
		}
		close(release)
		r.wait(t)
		if n := m.inFlight(); n != 0 {
			t.Fatalf("in flight %v after the answer", n)
		}
	})
	for _, c := range []struct {
		name string
		set  func(m *mrig)
		run  func(t *testing.T, m *mrig)
	}{
		{"failover exhausted", func(m *mrig) {
			m.pool = []string{"a", "b"}
			m.upstream = func(string, *http.Request, string) (*http.Response, error) { return nil, errRefused }
		}, nil},
		{"no worker", func(m *mrig) {}, nil},
		{"client gone", func(m *mrig) {
			m.pool = []string{"a"}
			m.upstream = blockUntilDone(make(chan string, 1))
		}, func(t *testing.T, m *mrig) {
			r := m.start(`{"model":"m","prompt":"hi"}`)
			gwait(t, "the request in flight", func() bool { return m.inFlight() == 1 })
			r.cancel()
			r.wait(t)
		}},
		{"crash", func(m *mrig) {
			m.pool = []string{"a"}
			m.upstream = func(string, *http.Request, string) (*http.Response, error) {
				return reply(200, "application/json", okJSON), nil
			}
		}, func(t *testing.T, m *mrig) {
			m.runCrashing(t)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMRig(t)
			m.d.MaxAttempts = 2
			c.set(m)
			if c.run != nil {
				c.run(t, m)
			} else {
				m.do(`{"model":"m","prompt":"hi"}`)
			}
			if n := m.inFlight(); n != 0 {
				t.Fatalf("in flight %v after the request ended", n)
			}
		})
	}
}
