package admission

import (
	"fmt"
	"sync"
)

// Wait is why a queued request waits: a typed kind, named once where it is defined. The queue
// defines its own (WaitCapacity, WaitNoWorker, WaitHeld); a policy registers its kinds with
// NewWait in its own package.
type Wait uint8

// The queue's wait kinds.
var (
	// WaitNone: the request is not waiting (ready to be asked, or dispatched).
	WaitNone = NewWait("ready")
	// WaitCapacity: every candidate worker is at the busy threshold.
	WaitCapacity = NewWait("capacity")
	// WaitNoWorker: no candidate worker exists (none live, or a disaggregated route lacks a
	// prefill worker); one may come back before max_wait.
	WaitNoWorker = NewWait("no_worker")
	// WaitHeld: a gate held the head without naming a kind.
	WaitHeld = NewWait("held")
	// WaitFailed: the gate panicked on the head, which is about to be answered 500 (R15.3).
	WaitFailed = NewWait("failed")
)

var waits struct {
	sync.Mutex
	names []string
}

// NewWait registers a wait kind by name (at package initialisation); a duplicate name panics.
func NewWait(name string) Wait {
	waits.Lock()
	defer waits.Unlock()
	for _, n := range waits.names {
		if n == name {
			panic(fmt.Sprintf("admission: wait kind %q registered twice", name))
		}
	}
	if len(waits.names) == 255 {
		panic("admission: too many wait kinds")
	}
	waits.names = append(waits.names, name)
	return Wait(len(waits.names) - 1)
}

func (w Wait) String() string {
	waits.Lock()
	defer waits.Unlock()
	if int(w) < len(waits.names) {
		return waits.names[w]
	}
	return "unknown"
}

// blocksOnCapacity reports whether a head waiting for w waits on the workers (not on a gate).
func (w Wait) blocksOnCapacity() bool { return w == WaitCapacity || w == WaitNoWorker }
