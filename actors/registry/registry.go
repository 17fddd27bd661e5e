// Package registry is the registry actor: heartbeats come in from the gRPC adapter, one worker
// actor per engine is spawned, updated, drained and, when its deadline fires, stopped (R1).
// The registry also answers heartbeat acks with the drain flag and the route table's epoch.
package registry

import (
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/worker"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/errs"
)

// Heartbeat is one validated WorkerStatus, or one successful scrape of a static worker; the
// reply is *Ack.
type Heartbeat struct {
	Info router.WorkerInfo // LastHeartbeat is ignored: the registry stamps arrival on its clock
	// TTL overrides k·T for this worker (a static worker: k·scrape_interval); 0 = k·T.
	TTL time.Duration
	// Reply, when set, receives the ack instead of a Respond: the gRPC handler waits on it
	// directly, which spares a future (its registration and its timer) on every heartbeat.
	// It must have room for one value.
	Reply chan Ack
	// Credential names who sent it (R13.1): "" for an open registry, CredentialStatic for a
	// scrape, else the adapter's name for a token or a client certificate. A live worker's id
	// is bound to the credential that registered it.
	Credential string
	// Quotas are the caps the credential's workers count against (R20); a new id beyond any
	// of them is refused with ErrTooManyWorkers.
	Quotas []Quota
}

// Quota caps the workers registered at once under one key (R20: a registry token's
// max_workers, certificate_max_workers for a client-certificate identity).
type Quota struct {
	// Key names what is counted ("token:0", "cert:engine-a"); keys are the adapter's, built
	// from verified credentials only.
	Key string
	// Max is the most workers at once under Key; 0 = no cap.
	Max int
}

// CredentialStatic is the credential of a static worker's scrapes: no engine presents it, so
// no heartbeat can take over a static worker's id.
const CredentialStatic = "\x00static"

// CredentialPool is the credential of an engine pool's scrapes (R23): apart from the static
// workers', so a static worker and a pool's worker never share an id.
const CredentialPool = "\x00pool"

// Retire removes a live worker registered with Credential now (R23: an engine pool's worker
// whose record vanished, once drained), as its deadline would; no reply. An unknown id, or
// one registered with another credential, is left alone.
type Retire struct {
	ID         string
	Credential string
}

// Refusals in Ack.Err; the heartbeat changed nothing.
var (
	// ErrTooManyWorkers: a new id beyond Config.MaxWorkers (gRPC ResourceExhausted).
	ErrTooManyWorkers = errors.New("too many workers")
	// ErrIDTaken: a live worker registered this id with another credential (gRPC
	// PermissionDenied).
	ErrIDTaken = errors.New("worker id taken")
)

// ScrapeFailed records a static worker's failed scrape: shown on the worker; it does not
// move its deadline.
type ScrapeFailed struct {
	ID     string
	Reason string
}

// Ack answers Heartbeat (SPEC B1 HeartbeatAck without the interval, which the adapter adds).
type Ack struct {
	Drain bool
	Epoch uint64
	// Err, when set, is why the heartbeat was refused (wrapping ErrTooManyWorkers or
	// ErrIDTaken); Drain and Epoch are then unset.
	Err error
}

// DrainModel drains (or undrains) every worker of a served model; the reply is *DrainResult or
// an error wrapping errs.ErrModelNotFound when no registered worker serves it.
type DrainModel struct {
	Model   string
	Drained bool
}

// SyncDrains sets the drained models to exactly Models, as the cluster's store read them
// from etcd (R16): workers of a model in the set are drained, the others undrained, and a
// worker that registers later follows the set. No reply; no model needs a worker.
type SyncDrains struct {
	Models []string
}

// DrainResult answers DrainModel.
type DrainResult struct {
	Workers int
}

// Config is what the registry needs.
type Config struct {
	Clock  clock.Clock
	Router *actor.PID
	// TTL is k·T (R1).
	TTL    time.Duration
	Logger *slog.Logger
	// WorkerOptions are extra props options for every worker actor (metrics, test middleware).
	WorkerOptions []actor.PropsOption
	// OnEvict, when set, is told each worker evicted (its deadline passed, or its actor was
	// stopped by its supervisor), on the registry's goroutine; it must return at once.
	OnEvict func(router.WorkerInfo)
	// OnMoved, when set, is told a live worker's previous info and its new one when a heartbeat
	// changes its grpc_address or kv_address (on the registry's goroutine; it must return at
	// once): nothing dials the addresses it left any more, and their connections must close
	// as an evicted worker's do, or each move of a live engine would keep one for good.
	OnMoved func(old, cur router.WorkerInfo)
	// OnAccepted, when set, is told each heartbeat the registry accepted, as forwarded to the
	// worker (Reg, the drains and the arrival time stamped), on the registry's goroutine; it
	// must return at once. Being on that goroutine, it is told of a registration after the
	// OnEvict of the one before and before the OnEvict of its own: the KvEvents subscriber
	// (R18.3) follows registrations in the order the registry made them.
	OnAccepted func(router.WorkerInfo)
	// MaxWorkers caps the registered workers ([registry] max_workers); a heartbeat of a new id
	// beyond it is refused, an existing id still heartbeats. 0 = no cap.
	MaxWorkers int
	// ConsecutiveFailures is handed to every worker actor (R14.2; 0 = ejection off).
	ConsecutiveFailures int
}

type entry struct {
	pid  *actor.PID
	info router.WorkerInfo // info.Reg numbers the registration (router.WorkerInfo.Reg)
	sent uint64            // statuses forwarded to the worker
	cred string            // the credential that registered the id
	// quotas: the Quota keys the worker counts under (at most one per credential layer).
	quotas []string
	// echo: the engine's draining is presumed the echo of the gateway's drain; echoLeft: after
	// an undrain, how many more heartbeats reporting draining are still that echo (drainEcho).
	echo     bool
	echoLeft int
	// warned is when the "latest wins" warning was last logged for this entry: at most once
	// per changeWarnEvery, since an engine that changes its address every heartbeat would
	// otherwise write a line per heartbeat.
	warned time.Time
}

// changeWarnEvery spaces the warnings about one worker's changing addresses or model (R20);
// grpcapi.MoveWindow, the window of the address changes the engine connections follow, is
// the same minute.
const changeWarnEvery = time.Minute

// Drain echoes (R19). An engine told to drain by a heartbeat ack reports draining until an ack
// no longer asks it to: its first heartbeat after an undrain still does (it left before the
// ack without the drain came back), and in a cluster it drains while any replica's latest ack
// to it asks for the drain (tlengine drains while any gateway's does). That echo of the
// gateway's own drain is no reason to stop routing once the drain is lifted; an engine that
// drains of its own accord (shutting down) still is. The registry, which sends the acks, tells
// one from the other (router.WorkerInfo.DrainEcho):
//   - a heartbeat that reports draining while its model is drained is the echo, unless the
//     engine already reported draining before the drain (then it drains by itself; a new
//     registration has reported nothing before);
//   - an undrain keeps a worker's echo for its next echoHeartbeats heartbeats: the worker is
//     routable at once, and those heartbeats may still report draining (the one already on its
//     way, and in a cluster one made before another replica's first ack without the drain
//     reached the engine);
//   - after that, and whenever the engine reports not draining, its draining is its own.
//
// An engine that begins to shut down within two heartbeats of an undrain is thus routed for up
// to two heartbeats more (its requests fail over; refused connections take it out at once).
// Scraped engines report no draining: a drain of theirs is the gateway's alone.

// echoHeartbeats is how many heartbeats after an undrain may still echo the drain.
const echoHeartbeats = 2

// drainEcho decides whether heartbeat info of worker e (nil: a new registration) reports
// draining as the echo of the gateway's drain; it returns e's new echo state.
func drainEcho(e *entry, info router.WorkerInfo) (echo bool, left int) {
	var wasDraining, wasEcho bool
	var wasLeft int
	if e != nil {
		wasDraining, wasEcho, wasLeft = e.info.Draining, e.echo, e.echoLeft
	}
	switch {
	case !info.Draining:
		return false, 0
	case info.AdminDrained:
		return wasEcho || !wasDraining, 0
	case wasLeft > 0:
		return wasEcho, wasLeft - 1
	}
	return false, 0
}

type state struct {
	cfg   Config
	epoch uint64
	// entries: one per registered worker (live, or evicted and not yet deleted: an entry goes
	// with its Expired or its actor's Terminated), so at most [registry] max_workers.
	entries map[string]*entry
	// drained: the models an operator drained (POST /admin/v1/models/{m}:drain, each naming a
	// model a worker served then) or the cluster store's set (SyncDrains, at most
	// cluster.MaxDrained); an undrain deletes. It outlives the model's workers on purpose: a
	// drained model stays drained for workers that register later.
	drained map[string]bool
	// quota: the workers registered under each Quota key; a key goes with its last worker, so
	// at most one per quota layer of each entry.
	quota map[string]int
	// spawned numbers the worker actors this registry has spawned, one per registration: each
	// gets a name of its own, so the Terminated of an id's stopped actor never matches the actor
	// of its next registration (a name reused at once would give both the same PID), and its
	// number is the registration's (router.WorkerInfo.Reg), which every message about the
	// worker names.
	spawned uint64
}

// Props returns the registry's props. Its state survives restarts. Worker actors are spawned
// at the top level with an always-restart guardian, not as the registry's children, so a
// restart of the registry (which stops an actor's children) never takes the workers with it.
func Props(cfg Config, opts ...actor.PropsOption) *actor.Props {
	return propsOf(newState(cfg), opts...)
}

func newState(cfg Config) *state {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &state{cfg: cfg, epoch: 1, entries: make(map[string]*entry), drained: make(map[string]bool), quota: make(map[string]int)}
}

// propsOf is the props of a registry actor over st (Props; tests keep st to read its tables).
func propsOf(st *state, opts ...actor.PropsOption) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &registryActor{st: st} }, opts...)
}

type registryActor struct{ st *state }

// Receive handles the registry's messages.
func (r *registryActor) Receive(c actor.Context) {
	st := r.st
	switch m := c.Message().(type) {
	case *Heartbeat:
		ack := st.heartbeat(c, m)
		if m.Reply != nil {
			m.Reply <- *ack
		} else {
			c.Respond(ack)
		}
	case *ScrapeFailed:
		if e := st.entries[m.ID]; e != nil {
			c.Send(e.pid, &worker.ScrapeError{Reason: m.Reason})
		}
	case *Retire:
		if e := st.entries[m.ID]; e != nil && e.cred == m.Credential {
			c.Send(e.pid, &worker.Retire{})
		}
	case *worker.Expired:
		e := st.entries[m.ID]
		if e == nil || e.sent != m.Seq {
			return // a newer heartbeat is on its way to the worker: it revives
		}
		if m.Retired {
			st.cfg.Logger.Info("worker removed: retired", "worker", m.ID)
		} else {
			st.cfg.Logger.Info("worker evicted: heartbeat deadline passed", "worker", m.ID,
				"last_heartbeat", e.info.LastHeartbeat, "ttl", st.cfg.TTL)
		}
		delete(st.entries, m.ID)
		c.Stop(e.pid)
		st.evicted(e)
	case *actor.Terminated:
		for id, e := range st.entries {
			if e.pid.Equal(m.Who) {
				delete(st.entries, id)
				st.cfg.Logger.Warn("worker actor stopped by its supervisor", "worker", id)
				st.evicted(e)
				return
			}
		}
	case *DrainModel:
		c.Respond(st.drain(c, m))
	case *SyncDrains:
		st.syncDrains(c, m)
	case *router.EpochChanged:
		// The epoch follows the route table's: strictly increasing on one node, and the etcd
		// revision in a cluster (R16), which a rebuilt etcd may restart lower.
		st.epoch = m.Epoch
	case *actor.Stopping:
		for _, e := range st.entries {
			c.Stop(e.pid)
		}
	}
}

// evicted takes a worker that left the registry off its quotas and tells OnEvict.
func (st *state) evicted(e *entry) {
	for _, k := range e.quotas {
		if n := st.quota[k] - 1; n > 0 {
			st.quota[k] = n
		} else {
			delete(st.quota, k)
		}
	}
	if st.cfg.OnEvict != nil {
		st.cfg.OnEvict(e.info)
	}
}

func (st *state) heartbeat(c actor.Context, m *Heartbeat) *Ack {
	info := m.Info
	info.LastHeartbeat = st.cfg.Clock.Now()
	info.AdminDrained = st.drained[info.Model]
	ttl := st.cfg.TTL
	if m.TTL > 0 {
		ttl = m.TTL
	}
	e := st.entries[info.ID]
	switch {
	case e != nil && e.cred != m.Credential:
		st.cfg.Logger.Warn("heartbeat refused: the worker id is registered with another credential", "worker", info.ID)
		return &Ack{Err: fmt.Errorf("worker id %q is registered by a live worker with another credential: %w", info.ID, ErrIDTaken)}
	case e == nil && st.cfg.MaxWorkers > 0 && len(st.entries) >= st.cfg.MaxWorkers:
		return &Ack{Err: fmt.Errorf("%d workers are registered, the most max_workers allows: %w", len(st.entries), ErrTooManyWorkers)}
	case e == nil:
		for _, q := range m.Quotas {
			if q.Max > 0 && st.quota[q.Key] >= q.Max {
				return &Ack{Err: fmt.Errorf("%d workers are registered with this credential, the most its max_workers allows: %w", st.quota[q.Key], ErrTooManyWorkers)}
			}
		}
	}
	echo, echoLeft := drainEcho(e, info)
	info.DrainEcho = info.Draining && echo
	if e == nil {
		st.spawned++
		info.Reg = st.spawned
		e = &entry{info: info, sent: 1, cred: m.Credential}
		for _, q := range m.Quotas {
			if q.Max > 0 {
				st.quota[q.Key]++
				e.quotas = append(e.quotas, q.Key)
			}
		}
		props := worker.Props(worker.Config{
			Clock: st.cfg.Clock, Router: st.cfg.Router, Registry: c.Self(), TTL: ttl,
			ConsecutiveFailures: st.cfg.ConsecutiveFailures,
		}, worker.Status{Info: info, Seq: 1, TTL: ttl}, append([]actor.PropsOption{
			actor.WithGuardian(actor.RestartingSupervisorStrategy()),
		}, st.cfg.WorkerOptions...)...)
		pid, err := c.ActorSystem().Root.SpawnNamed(props, "worker/"+sanitize(info.ID)+"#"+strconv.FormatUint(st.spawned, 10))
		if err != nil {
			// Another actor of the system took the name: fall back to a generated one.
			pid = c.ActorSystem().Root.SpawnPrefix(props, "worker/")
		}
		e.pid = pid
		c.Watch(pid)
		st.entries[info.ID] = e
		st.cfg.Logger.Info("worker registered", "worker", info.ID, "model", info.Model,
			"role", info.Role.String(), "http", info.HTTPAddress)
	} else {
		if (e.info.HTTPAddress != info.HTTPAddress || e.info.GRPCAddress != info.GRPCAddress ||
			e.info.KVAddress != info.KVAddress || e.info.Model != info.Model) &&
			(e.warned.IsZero() || info.LastHeartbeat.Sub(e.warned) >= changeWarnEvery) {
			e.warned = info.LastHeartbeat
			st.cfg.Logger.Warn("worker id reported with different addresses or model: the latest wins",
				"worker", info.ID, "old_http", e.info.HTTPAddress, "new_http", info.HTTPAddress,
				"old_model", e.info.Model, "new_model", info.Model)
		}
		moved := e.info.GRPCAddress != info.GRPCAddress || e.info.KVAddress != info.KVAddress
		old := e.info
		info.Reg = e.info.Reg
		e.info = info
		e.sent++
		if moved && st.cfg.OnMoved != nil {
			st.cfg.OnMoved(old, info)
		}
		c.Send(e.pid, &worker.Status{Info: info, Seq: e.sent, TTL: ttl})
	}
	e.echo, e.echoLeft = echo, echoLeft
	if st.cfg.OnAccepted != nil {
		st.cfg.OnAccepted(info)
	}
	return &Ack{Drain: info.AdminDrained, Epoch: st.epoch}
}

func (st *state) drain(c actor.Context, m *DrainModel) any {
	n := 0
	for _, e := range st.entries {
		if e.info.Model == m.Model {
			n++
		}
	}
	if n == 0 {
		return fmt.Errorf("no registered worker serves the model %s: %w", errs.Echo(m.Model), errs.ErrModelNotFound)
	}
	if m.Drained {
		st.drained[m.Model] = true
	} else {
		delete(st.drained, m.Model)
	}
	for _, e := range st.entries {
		if e.info.Model == m.Model {
			st.setDrained(c, e, m.Drained)
		}
	}
	st.cfg.Logger.Info("model drain changed", "model", m.Model, "drained", m.Drained, "workers", n)
	return &DrainResult{Workers: n}
}

func (st *state) syncDrains(c actor.Context, m *SyncDrains) {
	want := make(map[string]bool, len(m.Models))
	for _, model := range m.Models {
		want[model] = true
	}
	st.drained = want
	n := 0
	for _, e := range st.entries {
		if d := want[e.info.Model]; d != e.info.AdminDrained {
			st.setDrained(c, e, d)
			n++
		}
	}
	st.cfg.Logger.Info("drained models synchronised from the cluster store", "models", len(want), "workers_changed", n)
}

// setDrained drains (or undrains) worker e. An undrain keeps the echo of the drain the engine
// reports (its worker stays DrainEcho) for its next echoHeartbeats heartbeats, so it is
// routable at once; a drain starts afresh.
func (st *state) setDrained(c actor.Context, e *entry, drained bool) {
	e.info.AdminDrained = drained
	switch {
	case drained:
		e.echoLeft = 0
	case e.echo:
		e.echoLeft = echoHeartbeats
	}
	c.Send(e.pid, &worker.SetDrained{Drained: drained})
}

// sanitize makes a worker id usable in an actor name: protoactor reserves '$' and uses '/' as
// a separator.
func sanitize(id string) string {
	b := []byte(id)
	for i, ch := range b {
		if ch == '$' || ch == '/' || ch < 0x21 || ch > 0x7e {
			b[i] = '_'
		}
	}
	return string(b)
}
