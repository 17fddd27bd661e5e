package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tlgw/tlgw/internal/clock"
)

// LoRA bounds: the adapters an engine serves (--lora plus runtime loads), a name's and a path's
// length. Names and paths are printable ASCII.
const (
	MaxLoRAAdapters = 1024
	MaxLoRANameLen  = 256
	MaxLoRAPathLen  = 4096
)

// LoRA is one adapter the engine serves besides its base model: requests name it as their model;
// /v1/models lists it with its path as "root".
type LoRA struct {
	Name, Path string
}

// ParseLoRAList reads --lora: comma-separated adapters, each "name" or "name=path" (the path
// defaults to /adapters/<name>).
func ParseLoRAList(s string) ([]LoRA, error) {
	var out []LoRA
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, path, ok := strings.Cut(item, "=")
		if !ok {
			path = "/adapters/" + name
		}
		out = append(out, LoRA{Name: name, Path: path})
	}
	return out, nil
}

// checkLoRA validates one adapter against the bounds and the base model's name.
func checkLoRA(l LoRA, base string) error {
	switch {
	case l.Name == "" || len(l.Name) > MaxLoRANameLen || !printable(l.Name):
		return fmt.Errorf("the adapter name %q must be 1 to %d bytes of printable ASCII", l.Name, MaxLoRANameLen)
	case l.Path == "" || len(l.Path) > MaxLoRAPathLen || !printable(l.Path):
		return fmt.Errorf("the path of adapter %q must be 1 to %d bytes of printable ASCII", l.Name, MaxLoRAPathLen)
	case l.Name == base:
		return fmt.Errorf("the adapter name %q is the base model's", l.Name)
	}
	return nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// loras is the adapters the engine serves and the GPU slots their requests run in. An adapter's
// requests run only while it holds a slot; there are max slots. A request whose adapter holds
// none takes a free slot, or else the least recently used slot with no running request (a swap:
// the request waits swap on the engine's clock before its prefill, as loading the weights
// would take); while every slot holds an adapter with running requests it waits, in FIFO
// order among those that cannot go. Its mutex is taken before the scheduler's, never inside.
type loras struct {
	mu    sync.Mutex
	clk   clock.Clock
	max   int
	swap  time.Duration
	paths map[string]string // served adapters: name → path; at most MaxLoRAAdapters
	order []string          // served adapter names in load order
	slots map[string]*slot  // adapters in a GPU slot; at most max entries
	// waiting is the requests whose adapter waits for a slot; bounded by the requests in
	// flight (each waits on its own handler).
	waiting []*slotWaiter
	tick    uint64    // the LRU clock: bumped at every release
	swaps   uint64    // adapters loaded into a slot, ever
	changed time.Time // when the running or waiting adapters last changed
}

type slot struct {
	running int
	used    uint64 // tick of its last release
}

type slotWaiter struct {
	name    string
	ready   chan struct{} // closed once placed (or refused)
	swapped bool
	err     error
}

func newLoRAs(clk clock.Clock, max int, swap time.Duration, initial []LoRA) *loras {
	l := &loras{clk: clk, max: max, swap: swap, paths: make(map[string]string), slots: make(map[string]*slot),
		changed: clk.Now()}
	for _, a := range initial {
		l.paths[a.Name] = a.Path
		l.order = append(l.order, a.Name)
	}
	return l
}

// served reports whether name is a served adapter.
func (l *loras) served(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.paths[name]
	return ok
}

// list is the served adapters in load order, each with its path.
func (l *loras) list() []LoRA {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]LoRA, len(l.order))
	for i, n := range l.order {
		out[i] = LoRA{Name: n, Path: l.paths[n]}
	}
	return out
}

// names is the served adapters' names in load order.
func (l *loras) names() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.order)
}

// errLoRAExists, errLoRAUnknown and errLoRAFull are the runtime API's refusals.
var (
	errLoRAExists  = fmt.Errorf("the adapter is already loaded")
	errLoRAUnknown = fmt.Errorf("the adapter is not loaded")
	errLoRAFull    = fmt.Errorf("the engine serves %d adapters already", MaxLoRAAdapters)
)

// load adds a served adapter (POST /v1/load_lora_adapter).
func (l *loras) load(a LoRA) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.paths[a.Name]; ok {
		return errLoRAExists
	}
	if len(l.order) >= MaxLoRAAdapters {
		return errLoRAFull
	}
	l.paths[a.Name] = a.Path
	l.order = append(l.order, a.Name)
	return nil
}

// unload stops serving an adapter (POST /v1/unload_lora_adapter). Its running requests finish;
// its slot goes with the last of them; its waiting requests are refused.
func (l *loras) unload(name string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.paths[name]; !ok {
		return errLoRAUnknown
	}
	delete(l.paths, name)
	l.order = slices.DeleteFunc(l.order, func(n string) bool { return n == name })
	if s, ok := l.slots[name]; ok && s.running == 0 {
		delete(l.slots, name)
	}
	l.dispatchLocked()
	return nil
}

// acquire waits until name's requests may run and counts one more running; swapped says the
// adapter was loaded into a slot for it (the caller then waits the swap cost). A caller that
// leaves while waiting gives up its place; errLoRAUnknown: the adapter is not served (any
// more).
func (l *loras) acquire(ctx context.Context, name string) (swapped bool, err error) {
	l.mu.Lock()
	if _, ok := l.paths[name]; !ok {
		l.mu.Unlock()
		return false, errLoRAUnknown
	}
	if ok, swapped := l.placeLocked(name); ok {
		l.changed = l.clk.Now()
		l.mu.Unlock()
		return swapped, nil
	}
	w := &slotWaiter{name: name, ready: make(chan struct{})}
	l.waiting = append(l.waiting, w)
	l.changed = l.clk.Now()
	l.mu.Unlock()
	select {
	case <-w.ready:
		return w.swapped, w.err
	case <-ctx.Done():
		l.mu.Lock()
		defer l.mu.Unlock()
		select {
		case <-w.ready: // placed meanwhile: hand the slot back
			if w.err == nil {
				l.releaseLocked(name)
			}
		default:
			l.waiting = slices.DeleteFunc(l.waiting, func(q *slotWaiter) bool { return q == w })
			l.changed = l.clk.Now()
		}
		return false, ctx.Err()
	}
}

// placeLocked counts a running request of name if its adapter holds a slot or can take one
// (a free one, else the least recently used idle one); it reports whether it could and
// whether the adapter was loaded for it.
func (l *loras) placeLocked(name string) (ok, swapped bool) {
	if s, ok := l.slots[name]; ok {
		s.running++
		return true, false
	}
	if len(l.slots) >= l.max {
		victim, best := "", uint64(0)
		for n, s := range l.slots {
			if s.running == 0 && (victim == "" || s.used < best || s.used == best && n < victim) {
				victim, best = n, s.used
			}
		}
		if victim == "" {
			return false, false
		}
		delete(l.slots, victim)
	}
	l.slots[name] = &slot{running: 1}
	l.swaps++
	return true, true
}

// release counts one request of name as finished.
func (l *loras) release(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(name)
}

func (l *loras) releaseLocked(name string) {
	s := l.slots[name]
	s.running--
	l.tick++
	s.used = l.tick
	if _, ok := l.paths[name]; !ok && s.running == 0 {
		delete(l.slots, name) // unloaded while it ran
	}
	l.changed = l.clk.Now()
	l.dispatchLocked()
}

// dispatchLocked places every waiter that can go now, in order; one whose adapter was unloaded
// is refused.
func (l *loras) dispatchLocked() {
	kept := l.waiting[:0]
	for _, w := range l.waiting {
		if _, ok := l.paths[w.name]; !ok {
			w.err = errLoRAUnknown
			close(w.ready)
			continue
		}
		if ok, swapped := l.placeLocked(w.name); ok {
			w.swapped = swapped
			close(w.ready)
			continue
		}
		kept = append(kept, w)
	}
	clear(l.waiting[len(kept):])
	if len(kept) != len(l.waiting) {
		l.changed = l.clk.Now()
	}
	l.waiting = kept
}

// loraInfo is what vllm:lora_requests_info reports: the adapters with running requests and
// those with waiting ones (each sorted, comma-separated), and when that last changed.
type loraInfo struct {
	running, waiting string
	max              int
	changed          time.Time
	swaps            uint64
}

func (l *loras) info() loraInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	var run, wait []string
	for n, s := range l.slots {
		if s.running > 0 {
			run = append(run, n)
		}
	}
	seen := make(map[string]bool)
	for _, w := range l.waiting {
		if !seen[w.name] {
			seen[w.name] = true
			wait = append(wait, w.name)
		}
	}
	slices.Sort(run)
	slices.Sort(wait)
	return loraInfo{running: strings.Join(run, ","), waiting: strings.Join(wait, ","), max: l.max,
		changed: l.changed, swaps: l.swaps}
}
