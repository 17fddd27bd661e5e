package app

import (
	"sync"
	"time"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/history"
)

// historySampler takes a sample of the gateway's recent past every history.Resolution on the
// app's clock (R24, GET /admin/v1/history): its registry's families and the workers' in-flight
// counts. One goroutine, and one pending timer that sets the next; close ends both and waits.
type historySampler struct {
	h      *history.History
	stop   chan struct{}
	cancel func() // closes stop and stops the pending timer
	done   sync.WaitGroup
}

func (a *App) startHistory() *historySampler {
	s := &historySampler{h: history.New(), stop: make(chan struct{})}
	wake := make(chan time.Time, 1) // the latest due sample; one waits at most
	var mu sync.Mutex
	var next clock.Timer // the one pending timer
	var tick func()
	tick = func() {
		// The next timer is set from this one, on the clock itself: a sample is due every
		// Resolution whenever the sampling goroutine runs.
		mu.Lock()
		select {
		case <-s.stop:
		default:
			next = a.clock.AfterFunc(history.Resolution, tick)
		}
		mu.Unlock()
		select {
		case wake <- a.clock.Now():
		default:
		}
	}
	mu.Lock()
	next = a.clock.AfterFunc(history.Resolution, tick)
	mu.Unlock()
	s.cancel = func() {
		mu.Lock()
		close(s.stop)
		next.Stop()
		mu.Unlock()
	}
	s.done.Add(1)
	go func() {
		defer s.done.Done()
		for {
			select {
			case now := <-wake:
				s.sample(a, now)
			case <-s.stop:
				return
			}
		}
	}()
	return s
}

// sample reads the registry and the worker list; a failed read leaves that part out.
func (s *historySampler) sample(a *App, now time.Time) {
	in := history.Input{Workers: map[string]int64{}} // at most the live workers
	if fams, err := a.Registry.Gather(); err == nil {
		in.Families = fams
	}
	if ws, err := a.Gateway.Workers(); err == nil {
		for _, w := range ws.Workers {
			in.Workers[w.Info.ID] = w.InFlight
		}
	}
	s.h.Sample(now, in)
}

func (s *historySampler) snapshot() history.Snapshot { return s.h.Snapshot() }

func (s *historySampler) close() {
	if s == nil {
		return
	}
	s.cancel()
	s.done.Wait()
}
