package router

import (
	"container/list"
	"fmt"
	"slices"

	"github.com/tlgw/tlgw/internal/errs"
)

// Stored responses (R21). An engine that stores a Responses API answer keeps it in its own
// memory: GET and DELETE /v1/responses/{id}, and a new response that continues it
// (previous_response_id), must reach that engine. The request actor tells the router the id of
// every stored answer it relayed (StoreResponse); a pick naming a response (Pick.Response) goes
// to the worker that stored it, whatever the route's policy would pick, or fails with a 404
// that says why: no such response is known to this gateway, or the worker that held it has
// left (its engine's memory went with it).
//
// Ids are the engines'; an entry belongs to the API key whose request stored it, and another
// key's pick does not find it. The first entry for an id stays: a second engine answering the
// same id cannot take over another's response.
//
// Bounds (R19): at most MaxStoredResponses entries, and at most a quarter of them (at least 1)
// of one API key: a key at its share forgets its own oldest for a new one, so no key evicts
// the others' entries beyond its share; a full table forgets its oldest entry. A forgotten
// response stays on its engine, reachable only by a client that goes there. Deleted entries,
// and entries of a worker found gone, leave the table at once; owners holds one list per key
// with entries (at most the configured keys, plus open mode's -1).

// DefaultMaxStoredResponses is the table's default size.
const DefaultMaxStoredResponses = 65536

// StoreResponse records that the worker (ID, registration) stored response ID for the API key
// Owner (-1: open mode). No reply.
type StoreResponse struct {
	ID       string
	WorkerID string
	Reg      uint64
	Owner    int
}

// ForgetResponse drops response ID of Owner (its DELETE succeeded). No reply.
type ForgetResponse struct {
	ID    string
	Owner int
}

// IgnoreDeadLetterLogging: the router may be stopping.
func (*StoreResponse) IgnoreDeadLetterLogging()  {}
func (*ForgetResponse) IgnoreDeadLetterLogging() {}

type storedResponse struct {
	id     string
	worker string
	reg    uint64
	owner  int
	all    *list.Element // in responseTable.all
	mine   *list.Element // in its owner's list
}

// responseTable maps response ids to the workers that stored them, oldest first out.
type responseTable struct {
	max, share int
	byID       map[string]*storedResponse // at most max entries
	all        *list.List                 // every entry, oldest first
	owners     map[int]*list.List         // each key's entries, oldest first (no empty list)
}

func newResponseTable(size int) *responseTable {
	if size <= 0 {
		size = DefaultMaxStoredResponses
	}
	return &responseTable{max: size, share: max(1, size/4), byID: make(map[string]*storedResponse),
		all: list.New(), owners: make(map[int]*list.List)}
}

func (t *responseTable) store(m *StoreResponse) {
	if _, ok := t.byID[m.ID]; ok {
		return
	}
	if mine := t.owners[m.Owner]; mine != nil && mine.Len() >= t.share {
		t.remove(mine.Front().Value.(*storedResponse))
	} else if t.all.Len() >= t.max {
		t.remove(t.all.Front().Value.(*storedResponse))
	}
	mine := t.owners[m.Owner]
	if mine == nil {
		mine = list.New()
		t.owners[m.Owner] = mine
	}
	e := &storedResponse{id: m.ID, worker: m.WorkerID, reg: m.Reg, owner: m.Owner}
	e.all, e.mine = t.all.PushBack(e), mine.PushBack(e)
	t.byID[m.ID] = e
}

// remove drops entry e.
func (t *responseTable) remove(e *storedResponse) {
	delete(t.byID, e.id)
	t.all.Remove(e.all)
	mine := t.owners[e.owner]
	mine.Remove(e.mine)
	if mine.Len() == 0 {
		delete(t.owners, e.owner)
	}
}

func (t *responseTable) forget(m *ForgetResponse) {
	if e, ok := t.byID[m.ID]; ok && e.owner == m.Owner {
		t.remove(e)
	}
}

// len is the entries held.
func (t *responseTable) len() int { return len(t.byID) }

// pinnedTarget resolves a pick that names a stored response to the worker that stored it:
// the slot, and the target its attempt serves (route, served model, adapter), or out.Err.
// The worker must still be the registration that stored it and live: draining or ejected
// included for a read or delete (only it holds the response), routable for a continuation
// (a new generation). An attempt there that failed (the worker in m.Exclude) is not tried
// again: no other worker holds the response (503). A continuation naming a model the worker
// does not serve (its base model, one of its adapters, or a route to it) is refused (400)
// rather than sent there as the worker's model.
func (st *state) pinnedTarget(m *Pick) (target, *slot) {
	out := &Picked{Tag: m.Tag, Steps: 1}
	t := target{out: out, endpoint: m.Endpoint}
	e, ok := st.responses.byID[m.Response]
	if !ok || e.owner != m.Owner {
		out.Err = fmt.Errorf("no stored response %s is known to this gateway: %w", m.Response, errs.ErrNotFound)
		return t, nil
	}
	s := st.view.registered(e.worker, e.reg)
	if s == nil || !s.live {
		st.responses.remove(e)
		out.Err = fmt.Errorf("the worker that stored response %s has left the fleet, and the response with it: %w", m.Response, errs.ErrNotFound)
		return t, nil
	}
	switch {
	case slices.Contains(m.Exclude, s.info.ID):
		out.Err = fmt.Errorf("the worker that stored response %s failed, and no other holds it: %w", m.Response, errs.ErrNoCapacity)
		return t, nil
	case m.Continues && s.pool == nil:
		out.Err = fmt.Errorf("the worker that stored response %s takes no new requests now (draining or ejected): %w", m.Response, errs.ErrNoCapacity)
		return t, nil
	}
	t.key = poolKey{model: s.info.Model, role: s.info.Role}
	out.Route, out.ServedModel = s.info.Model, s.info.Model
	if m.Model != "" {
		rt := st.table.byName[m.Model]
		switch {
		case m.Model == s.info.Model:
		case s.info.ServesLoRA(m.Model):
			out.ServedModel, t.adapter = m.Model, m.Model
		case rt != nil && rt.reaches(s.info.Model):
		default:
			out.Err = fmt.Errorf("response %s was stored by a worker of model %s, which does not serve %s: %w",
				m.Response, errs.Echo(s.info.Model), errs.Echo(m.Model), errs.ErrInvalidRequest)
			return t, nil
		}
		if rt != nil {
			out.Route = rt.id
		} else {
			out.Route = m.Model
		}
	}
	return t, s
}

// pinned answers a pick that names a stored response without the admission queue: the worker
// that stored it (pinnedTarget), reserved like any pick.
func (st *state) pinned(m *Pick, fx effects) *Picked {
	t, s := st.pinnedTarget(m)
	out := t.out
	if s == nil {
		return out
	}
	out.Ticket = st.view.reserve(s, m.Requester, fx)
	out.Worker, out.WorkerID, out.WorkerReg, out.HTTPAddress = s.pid, s.info.ID, s.info.Reg, s.info.HTTPAddress
	out.GRPCAddress, out.KVAddress = s.info.GRPCAddress, s.info.KVAddress
	out.Adapter = t.adapter
	return out
}
