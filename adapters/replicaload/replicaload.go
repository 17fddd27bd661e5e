// Package replicaload is the transport of the replicas' load exchange (SPEC R16, R23): with a
// cluster, each replica's router only counts its own requests in flight on each worker, so
// every replica streams that table to every other live replica about every 100 ms
// (tl.replica.v1.ReplicaLoad/Share), and each router adds what its peers report.
//
// The Sharer is the sending side: one stream per peer, each fed the latest table through a
// slot of one (a slow peer never delays the others or the tick, and never queues). The
// Server is the receiving side: it admits a stream only with the fleet's secret and from a
// live replica other than itself, validates every table, and holds at most one table per
// replica, the one its current stream sent last: a stream's end, for any reason, forgets it.
//
// Neither side knows the router's state; both go through Router, which the gateway implements
// by messages to its router actor.
package replicaload

import (
	"context"

	"github.com/tlgw/tlgw/internal/config"
)

// WorkerLoad is one replica's count of its own requests in flight on one worker.
type WorkerLoad struct {
	ID       string
	InFlight int64
}

// Router is the router as the exchange sees it. The Server calls SetReplicaLoad and
// ForgetReplica under its own lock, so that a stream's end and a newer stream's table are
// applied in the order they happened: both must return quickly (send a message) and must not
// call back into the Server.
type Router interface {
	// OwnLoad is this replica's nonzero in-flight counts per worker.
	OwnLoad(ctx context.Context) ([]WorkerLoad, error)
	// SetReplicaLoad replaces a peer's whole table (loads sorted by ID, each ID once, each
	// InFlight in 1…MaxInFlight).
	SetReplicaLoad(replica string, loads []WorkerLoad)
	// ForgetReplica says that peer's counts no longer hold.
	ForgetReplica(replica string)
}

// Bounds on a table, on both sides: the Sharer never sends a table the Server would refuse.
const (
	// DefaultMaxWorkers bounds the entries of one table unless Options say otherwise.
	DefaultMaxWorkers = 16384
	// MaxReplicas is the default bound on the peers a Server holds streams from, and on the
	// peers a Sharer streams to.
	MaxReplicas = 64
	// MaxWorkerIDLen bounds a worker id in bytes.
	MaxWorkerIDLen = 256
	// MaxInFlight bounds one count.
	MaxInFlight = 1 << 20
)

// TableBytes is the largest LoadTable, as encoded, with maxWorkers entries: every worker id of
// MaxWorkerIDLen bytes, every count MaxInFlight, the replica id of config.MaxReplicaIDLen
// bytes. A Server's gRPC MaxRecvMsgSize must be at least this (16,384 entries: 4,358,275
// bytes, over gRPC's default of 4 MiB).
//
// An entry is its tag (1 byte), its length (2) and its body: the id's tag (1), length (2) and
// bytes (256), the count's tag (1) and varint (3, for 2^20) — 266 bytes.
func TableBytes(maxWorkers int) int {
	const entry = 1 + 2 + (1 + 2 + MaxWorkerIDLen) + (1 + 3)
	const replica = 1 + 2 + config.MaxReplicaIDLen
	return replica + maxWorkers*entry
}
