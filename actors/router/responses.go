package router

import (
	"fmt"

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
// Bounds (R19): at most MaxStoredResponses entries; the oldest is forgotten for a new one (its
// response stays on its engine, reachable only by a client that goes there). Deleted entries
// leave the table at once.

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
	worker string
	reg    uint64
	owner  int
	seq    uint64 // its place in order, so an evicted ring slot names only its own entry
}

// responseTable maps response ids to the workers that stored them, oldest first out.
type responseTable struct {
	max   int
	byID  map[string]storedResponse // at most max entries
	order []string                  // ring of ids by insertion, len ≤ max
	seqs  []uint64                  // the seq of each ring slot's entry
	next  int                       // the ring slot the next entry takes
	seq   uint64
}

func newResponseTable(max int) *responseTable {
	if max <= 0 {
		max = DefaultMaxStoredResponses
	}
	return &responseTable{max: max, byID: make(map[string]storedResponse)}
}

func (t *responseTable) store(m *StoreResponse) {
	if _, ok := t.byID[m.ID]; ok {
		return
	}
	t.seq++
	if len(t.order) < t.max {
		t.order = append(t.order, m.ID)
		t.seqs = append(t.seqs, t.seq)
	} else {
		old := t.order[t.next]
		if e, ok := t.byID[old]; ok && e.seq == t.seqs[t.next] {
			delete(t.byID, old)
		}
		t.order[t.next], t.seqs[t.next] = m.ID, t.seq
	}
	t.next = (t.next + 1) % t.max
	t.byID[m.ID] = storedResponse{worker: m.WorkerID, reg: m.Reg, owner: m.Owner, seq: t.seq}
}

func (t *responseTable) forget(m *ForgetResponse) {
	if e, ok := t.byID[m.ID]; ok && e.owner == m.Owner {
		delete(t.byID, m.ID)
	}
}

// len is the entries held.
func (t *responseTable) len() int { return len(t.byID) }

// pinned answers a pick that names a stored response: the worker that stored it, if it is
// still the registration that did and live (draining or ejected included: only it holds the
// response), reserved like any pick.
func (st *state) pinned(m *Pick, fx effects) *Picked {
	out := &Picked{Tag: m.Tag, Steps: 1}
	e, ok := st.responses.byID[m.Response]
	if !ok || e.owner != m.Owner {
		out.Err = fmt.Errorf("no stored response %s is known to this gateway: %w", m.Response, errs.ErrNotFound)
		return out
	}
	s := st.view.registered(e.worker, e.reg)
	if s == nil || !s.live {
		delete(st.responses.byID, m.Response)
		out.Err = fmt.Errorf("the worker that stored response %s has left the fleet, and the response with it: %w", m.Response, errs.ErrNotFound)
		return out
	}
	out.Route, out.ServedModel = s.info.Model, s.info.Model
	if m.Model != "" {
		if s.info.ServesLoRA(m.Model) {
			out.ServedModel = m.Model
		}
		if rt := st.table.byName[m.Model]; rt != nil {
			out.Route = rt.id
		} else if m.Model == out.ServedModel {
			out.Route = m.Model
		}
	}
	out.Ticket = st.view.reserve(s, m.Requester, fx)
	out.Worker, out.WorkerID, out.WorkerReg, out.HTTPAddress = s.pid, s.info.ID, s.info.Reg, s.info.HTTPAddress
	out.GRPCAddress, out.KVAddress = s.info.GRPCAddress, s.info.KVAddress
	return out
}
