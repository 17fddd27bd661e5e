package replicaload

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"cmp"
	"fmt"
	"slices"
	"strings"

	replicav1 "github.com/tlgw/tlgw/contracts/tl/replica/v1"
)

// validate checks one table of a stream from replica (the id its first table named) sent as
// one message, and returns its nonzero entries sorted by worker id: validatePart then finish.
// A table is refused whole, naming the first rule it breaks: a replica_id other than replica,
// more than maxWorkers entries, a worker id empty or over MaxWorkerIDLen bytes, a count over
// MaxInFlight, a worker listed twice.
//
// Example: replica "gw-b", maxWorkers 3, table {replica_id "gw-b", workers [w2:4, w1:0, w3:1]}
// answers [w2:4, w3:1] sorted as [{w2 4} {w3 1}]; the same with w3 renamed w2 is refused
// ("listed twice"), and with replica_id "gw-c" too ("the stream is gw-b's").
func validate(t *replicav1.LoadTable, replica string, maxWorkers int) ([]WorkerLoad, error) {
	acc, err := validatePart(t, replica, maxWorkers, nil)
	if err != nil {
		return nil, err
	}
	return finish(acc)
}

// validatePart checks one part of a table (one message; a table of several says more on every
// part but its last) and appends its entries to acc, the table's parts so far: the rules of
// validate but for duplicates, which finish checks over the whole table; maxWorkers bounds
// the entries over all parts.
func validatePart(t *replicav1.LoadTable, replica string, maxWorkers int, acc []WorkerLoad) ([]WorkerLoad, error) {
	if t.GetReplicaId() != replica {
		return nil, fmt.Errorf("the table's replica_id is not %q, which this stream's first table named", replica)
	}
	ws := t.GetWorkers()
	if len(acc)+len(ws) > maxWorkers {
		return nil, fmt.Errorf("the table lists %d workers, over the bound of %d", len(acc)+len(ws), maxWorkers)
	}
	if acc == nil {
		acc = make([]WorkerLoad, 0, len(ws)) // at most maxWorkers over the parts, checked above
	}
	for i, w := range ws {
		id := w.GetWorkerId()
		if id == "" || len(id) > MaxWorkerIDLen {
			return nil, fmt.Errorf("workers[%d]: a worker id is 1 to %d bytes, not %d", i, MaxWorkerIDLen, len(id))
		}
		if n := w.GetInFlight(); n > MaxInFlight {
			return nil, fmt.Errorf("workers[%d] (%q): in_flight %d is over the bound of %d", i, id, n, MaxInFlight)
		}
		acc = append(acc, WorkerLoad{ID: id, InFlight: int64(w.GetInFlight())})
	}
	return acc, nil
}

// finish is a whole table of checked parts: sorted by worker id, a worker listed twice refused,
// zero counts left out.
func finish(acc []WorkerLoad) ([]WorkerLoad, error) {
	slices.SortFunc(acc, func(a, b WorkerLoad) int { return strings.Compare(a.ID, b.ID) })
	for i := 1; i < len(acc); i++ {
		if acc[i].ID == acc[i-1].ID {
			return nil, fmt.Errorf("worker %q is listed twice", acc[i].ID)
		}
	}
	return slices.DeleteFunc(acc, func(w WorkerLoad) bool { return w.InFlight == 0 }), nil
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

// MaxPartBytes bounds one encoded part of a table: under the registry port's 64 KiB message
// limit (adapters/grpc MaxRecvMsgSize) with room to spare.
const MaxPartBytes = 60 << 10

// encode is the LoadTable of self's sanitized loads, in parts of at most partBytes encoded
// bytes each (every part but the last says more); an empty table is one empty part.
func encode(self string, loads []WorkerLoad, partBytes int) []*replicav1.LoadTable {
	head := proto.Size(&replicav1.LoadTable{ReplicaId: self, More: true})
	parts := []*replicav1.LoadTable{{ReplicaId: self}}
	size := head
	for _, w := range loads {
		e := &replicav1.WorkerLoad{WorkerId: w.ID, InFlight: uint32(w.InFlight)}
		n := proto.Size(e)
		n += 1 + protowire.SizeVarint(uint64(n)) // its tag and length in the table
		cur := parts[len(parts)-1]
		if len(cur.Workers) > 0 && size+n > partBytes {
			cur.More = true
			parts = append(parts, &replicav1.LoadTable{ReplicaId: self})
			cur, size = parts[len(parts)-1], head
		}
		cur.Workers = append(cur.Workers, e)
		size += n
	}
	return parts
}
