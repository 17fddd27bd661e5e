package worker

import "github.com/asynkron/protoactor-go/actor"

// holds is the worker's in-flight count: one hold per ticket the router handed out for this
// worker, with the requester that holds it. The count is the number of holds, so it can
// neither drift nor go negative: a ticket released twice, or released after its requester
// stopped, is simply not there.
//
// A requester is watched from its first hold. Its entry goes with its last hold: a request actor
// that finishes normally unwatches its workers itself (request.unwatchWorkers), so no Terminated
// would ever delete an emptied entry. A hold added after that watches the requester again (a
// second Watch of the same pair is a no-op in the requester's watcher set), and a Terminated
// that still comes finds no entry and ends nothing.
//
// Bounds: byTicket has one entry per live ticket (tickets the router handed out for this worker
// and not yet released or ended by their requester's stop), byReq one per requester holding at
// least one of them; both are empty when nothing is in flight on the worker.
type holds struct {
	byTicket map[uint64]*actor.PID
	byReq    map[string][]uint64 // requester actor id → its tickets (never empty)
}

// add records ticket; it reports whether requester must be watched (it holds nothing else
// here).
func (h *holds) add(ticket uint64, requester *actor.PID) bool {
	if h.byTicket == nil {
		h.byTicket, h.byReq = make(map[uint64]*actor.PID), make(map[string][]uint64)
	}
	if _, dup := h.byTicket[ticket]; dup {
		return false
	}
	h.byTicket[ticket] = requester
	if requester == nil {
		return false
	}
	ts, watched := h.byReq[requester.Id]
	h.byReq[requester.Id] = append(ts, ticket)
	return !watched
}

// release ends ticket's hold; it reports whether the ticket was held.
func (h *holds) release(ticket uint64) bool {
	requester, ok := h.byTicket[ticket]
	if !ok {
		return false
	}
	delete(h.byTicket, ticket)
	if requester != nil {
		ts := h.byReq[requester.Id]
		if i := indexOf(ts, ticket); i >= 0 {
			if ts = append(ts[:i], ts[i+1:]...); len(ts) == 0 {
				delete(h.byReq, requester.Id)
			} else {
				h.byReq[requester.Id] = ts
			}
		}
	}
	return true
}

// stopped ends every hold of a requester that stopped and forgets it; it returns how many
// holds there were.
func (h *holds) stopped(requester *actor.PID) int {
	ts := h.byReq[requester.Id]
	delete(h.byReq, requester.Id)
	for _, t := range ts {
		delete(h.byTicket, t)
	}
	return len(ts)
}

func (h *holds) count() int64 { return int64(len(h.byTicket)) }

func indexOf(ts []uint64, t uint64) int {
	for i, x := range ts {
		if x == t {
			return i
		}
	}
	return -1
}
