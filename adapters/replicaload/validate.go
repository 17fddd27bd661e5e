package replicaload

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	replicav1 "github.com/tlgw/tlgw/contracts/tl/replica/v1"
)

// validate checks one table of a stream from replica (the id its first table named) and
// returns its nonzero entries sorted by worker id. A table is refused whole, naming the first
// rule it breaks: a replica_id other than replica, more than maxWorkers entries, a worker id
// empty or over MaxWorkerIDLen bytes, a count over MaxInFlight, a worker listed twice.
//
// Example: replica "gw-b", maxWorkers 3, table {replica_id "gw-b", workers [w2:4, w1:0, w3:1]}
// answers [w2:4, w3:1] sorted as [{w2 4} {w3 1}]; the same with w3 renamed w2 is refused
// ("listed twice"), and with replica_id "gw-c" too ("the stream is gw-b's").
func validate(t *replicav1.LoadTable, replica string, maxWorkers int) ([]WorkerLoad, error) {
	if t.GetReplicaId() != replica {
		return nil, fmt.Errorf("the table's replica_id is not %q, which this stream's first table named", replica)
	}
	ws := t.GetWorkers()
	if len(ws) > maxWorkers {
		return nil, fmt.Errorf("the table lists %d workers, over the bound of %d", len(ws), maxWorkers)
	}
	out := make([]WorkerLoad, 0, len(ws)) // at most maxWorkers, checked above
	for i, w := range ws {
		id := w.GetWorkerId()
		if id == "" || len(id) > MaxWorkerIDLen {
			return nil, fmt.Errorf("workers[%d]: a worker id is 1 to %d bytes, not %d", i, MaxWorkerIDLen, len(id))
		}
		if n := w.GetInFlight(); n > MaxInFlight {
			return nil, fmt.Errorf("workers[%d] (%q): in_flight %d is over the bound of %d", i, id, n, MaxInFlight)
		}
		out = append(out, WorkerLoad{ID: id, InFlight: int64(w.GetInFlight())})
	}
	slices.SortFunc(out, func(a, b WorkerLoad) int { return strings.Compare(a.ID, b.ID) })
	for i := 1; i < len(out); i++ {
		if out[i].ID == out[i-1].ID {
			return nil, fmt.Errorf("worker %q is listed twice", out[i].ID)
		}
	}
	return slices.DeleteFunc(out, func(w WorkerLoad) bool { return w.InFlight == 0 }), nil
}

// sanitize is what a Sharer sends of loads: only what a Server accepts, whatever the router
// answered. Entries with no requests in flight, an invalid worker id, or a repeated worker id
// (the largest count is kept) are left out, counts over MaxInFlight are sent as MaxInFlight,
// and of more than maxWorkers workers those with the most requests are kept. Sorted by worker
// id.
//
// Example: maxWorkers 2, loads [b:3 a:0 c:9 b:5 "":4 d:1] answers [{b 5} {c 9}].
func sanitize(loads []WorkerLoad, maxWorkers int) []WorkerLoad {
	ok := make([]WorkerLoad, 0, len(loads)) // at most len(loads)
	for _, w := range loads {
		if w.InFlight > 0 && w.ID != "" && len(w.ID) <= MaxWorkerIDLen {
			ok = append(ok, WorkerLoad{ID: w.ID, InFlight: min(w.InFlight, MaxInFlight)})
		}
	}
	// Most requests first, so the first of each worker id and the first maxWorkers are the
	// ones kept.
	slices.SortFunc(ok, func(a, b WorkerLoad) int {
		return cmp.Or(cmp.Compare(b.InFlight, a.InFlight), strings.Compare(a.ID, b.ID))
	})
	seen := make(map[string]bool, len(ok)) // at most len(ok) keys
	ok = slices.DeleteFunc(ok, func(w WorkerLoad) bool {
		dup := seen[w.ID]
		seen[w.ID] = true
		return dup
	})
	ok = ok[:min(len(ok), maxWorkers)]
	slices.SortFunc(ok, func(a, b WorkerLoad) int { return strings.Compare(a.ID, b.ID) })
	return ok
}

// encode is the LoadTable of self's sanitized loads.
func encode(self string, loads []WorkerLoad) *replicav1.LoadTable {
	t := &replicav1.LoadTable{ReplicaId: self, Workers: make([]*replicav1.WorkerLoad, len(loads))}
	for i, w := range loads {
		t.Workers[i] = &replicav1.WorkerLoad{WorkerId: w.ID, InFlight: uint32(w.InFlight)}
	}
	return t
}
