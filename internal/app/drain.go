package app

import (
	"context"
	"net/http"
	"sync"
)

// drainGate counts the HTTP requests being served so a shutdown can keep the listener open
// until they have finished. Closing the listener at once (what http.Server.Shutdown does
// first) would refuse /readyz while streams drain: a Kubernetes readiness probe, a load
// balancer's health check, must instead see 503 during the whole grace period, and a new
// request must get 503 shutting_down rather than a refused connection.
type drainGate struct {
	mu       sync.Mutex
	active   int           // requests in their handler; bounded by the server's connections
	draining bool          // set once by wait
	idled    bool          // idle is closed (a request served after that does not close it again)
	idle     chan struct{} // closed the first time active is 0 while draining
}

func newDrainGate() *drainGate { return &drainGate{idle: make(chan struct{})} }

// wrap counts every request h serves.
func (d *drainGate) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		d.active++
		d.mu.Unlock()
		defer d.done()
		h.ServeHTTP(w, r)
	})
}

func (d *drainGate) done() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.active--
	d.closeIfIdle()
}

func (d *drainGate) closeIfIdle() {
	if d.draining && d.active == 0 && !d.idled {
		d.idled = true
		close(d.idle)
	}
}

// wait starts the drain (once) and returns when no request is being served or ctx ends,
// whichever is first. Requests arriving meanwhile are served (inference gets 503
// shutting_down, /readyz 503) and are waited for too.
func (d *drainGate) wait(ctx context.Context) {
	d.mu.Lock()
	d.draining = true
	d.closeIfIdle()
	d.mu.Unlock()
	select {
	case <-d.idle:
	case <-ctx.Done():
	}
}
