// Package enginepool finds unmodified engines by DNS (SPEC R23, [[gateway.engine_pools]]):
// every A/AAAA record of a pool's name is a scraped worker "<pool>/<ip:port>", as a static
// worker is (adapters/scrape feeds the registry; a new record gets traffic only after its first
// good scrape). A record that vanishes drains its worker — its scrapes go on, reporting
// draining, so no new request goes there while its own finish — and the worker is retired
// once the router counts nothing in flight on it (or leaves by itself, when its engine stops
// answering scrapes). The name is resolved again every refresh on the injected clock; a failed
// resolve keeps the last good set.
package enginepool

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/adapters/scrape"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/engineaddr"
)

// Resolver looks a name's addresses up; *net.Resolver is one (network "ip": A and AAAA).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Scraper runs the scrapers of a target set (scrape.Manager): Set replaces the whole set.
type Scraper interface {
	Set(targets []scrape.Target)
	Forget(series string)
}

// Fleet is what a drain needs of the gateway: the router's view of the workers (in flight,
// draining) and a way to remove one at once.
type Fleet interface {
	Workers() (*router.WorkerList, error)
	Retire(id string)
}

// MaxResolveTimeout bounds one lookup; a refresh shorter than it bounds it instead.
const MaxResolveTimeout = 5 * time.Second

// Options is what Pools need.
type Options struct {
	Resolver Resolver // nil: net.DefaultResolver
	Scraper  Scraper
	Fleet    Fleet
	// Rules are the engine address rules (R13.2, R20) a record's address must follow; a
	// refused one is dropped (reason refused).
	Rules  engineaddr.Rules
	Clock  clock.Clock  // nil: the real clock
	Logger *slog.Logger // nil: discard
	// Metrics may be nil (no series).
	Metrics *Metrics
}

// Pools runs the engine pools of one table.
type Pools struct {
	o Options

	mu sync.Mutex
	// pools by name: the table's (at most config.MaxEnginePools), plus pools dropped from it
	// whose workers still drain (each ends when they have).
	pools  map[string]*pool
	closed bool
	wg     sync.WaitGroup // one goroutine per pool
}

// pool is one pool's state; every field but cfg's copy in run is guarded by Pools.mu.
type pool struct {
	cfg    config.EnginePool
	host   string
	port   uint16
	ctx    context.Context
	cancel context.CancelFunc
	wake   chan struct{} // capacity 1: a config change asks for a resolve now
	// members by address: the records of the last good resolve (at most
	// config.MaxPoolWorkers) and the vanished ones still draining (at most
	// config.MaxPoolWorkers more: the oldest is retired at once beyond that).
	members map[netip.AddrPort]*member
	// closing: the pool left the table; nothing is resolved, every member drains.
	closing bool
	// emptyOnce: the last resolve found no record and the set was kept (an empty answer
	// empties the pool only when the next resolve confirms it).
	emptyOnce bool
	// dropped is the last resolve's count of records past the bound, logged when it changes.
	dropped int
}

type member struct {
	draining bool
	since    time.Time // when it began to drain
}

// New returns Pools with no pool; Set starts them.
func New(o Options) *Pools {
	if o.Resolver == nil {
		o.Resolver = net.DefaultResolver
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Pools{o: o, pools: make(map[string]*pool)}
}

// Set makes table the pools: new ones start (and resolve at once), changed ones take their
// new settings and resolve at once, and dropped ones drain every worker and end. The table is
// valid (config.ValidateEnginePools) and normalized.
func (ps *Pools) Set(table []config.EnginePool) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.closed {
		return
	}
	want := make(map[string]config.EnginePool, len(table)) // bounded by the table
	for _, c := range table {
		want[c.Name] = c
	}
	for name, p := range ps.pools {
		if _, ok := want[name]; !ok && !p.closing {
			p.closing = true
			for _, m := range p.members {
				ps.drainLocked(p, m)
			}
			ps.kick(p)
		}
	}
	for _, c := range table {
		p := ps.pools[c.Name]
		switch {
		case p == nil:
			p = ps.newPool(c)
			ps.pools[c.Name] = p
			ps.wg.Add(1)
			go ps.run(p)
		case p.closing || !equalPool(p.cfg, c):
			p.closing = false
			p.setConfig(c)
			ps.kick(p)
		}
	}
	ps.pushLocked()
}

func equalPool(a, b config.EnginePool) bool {
	return reflect.DeepEqual(a, b)
}

func (ps *Pools) newPool(c config.EnginePool) *pool {
	ctx, cancel := context.WithCancel(context.Background())
	p := &pool{ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1), members: make(map[netip.AddrPort]*member)}
	p.setConfig(c)
	ps.o.Metrics.workers(c.Name, 0, 0)
	return p
}

// setConfig takes a valid pool's settings (its dns is NAME:PORT).
func (p *pool) setConfig(c config.EnginePool) {
	host, port, _ := net.SplitHostPort(c.DNS)
	n, _ := strconv.ParseUint(port, 10, 16)
	p.cfg, p.host, p.port = c, host, uint16(n)
}

// kick asks p's loop to resolve now.
func (ps *Pools) kick(p *pool) {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Close stops every pool and waits for their goroutines; the workers are left as they are.
func (ps *Pools) Close() {
	ps.mu.Lock()
	ps.closed = true
	for _, p := range ps.pools {
		p.cancel()
	}
	ps.mu.Unlock()
	ps.wg.Wait()
}

// run is one pool's loop: resolve (every refresh), check the drains (every scrape interval
// while any member drains), until the pool is closed, or has left the table and drained.
func (ps *Pools) run(p *pool) {
	defer ps.wg.Done()
	var next time.Time // the next resolve; zero: now
	fire := make(chan struct{}, 1)
	for p.ctx.Err() == nil {
		ps.mu.Lock()
		closing, refresh, every := p.closing, time.Duration(p.cfg.Refresh), time.Duration(p.cfg.ScrapeInterval)
		ps.mu.Unlock()
		now := ps.o.Clock.Now()
		if !closing && !now.Before(next) {
			ps.resolve(p)
			next = now.Add(refresh)
		}
		draining := ps.checkDrains(p)
		if ps.ended(p) {
			return
		}
		wait := next.Sub(ps.o.Clock.Now())
		if closing {
			wait = every
		} else if draining {
			wait = min(wait, every)
		}
		tm := ps.o.Clock.AfterFunc(wait, func() {
			select {
			case fire <- struct{}{}:
			default:
			}
		})
		select {
		case <-fire:
		case <-p.wake:
			tm.Stop()
			next = time.Time{}
		case <-p.ctx.Done():
			tm.Stop()
		}
	}
}

// ended removes a closing pool whose members have all left, and says whether p is over.
func (ps *Pools) ended(p *pool) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if !p.closing || len(p.members) > 0 {
		return false
	}
	delete(ps.pools, p.cfg.Name)
	p.cancel()
	ps.o.Metrics.forget(p.cfg.Name)
	ps.o.Scraper.Forget(p.cfg.Name)
	ps.o.Logger.Info("engine pool removed", "pool", p.cfg.Name)
	return true
}

// resolve looks the pool's name up and applies the answer.
func (ps *Pools) resolve(p *pool) {
	ps.mu.Lock()
	host, refresh, name := p.host, time.Duration(p.cfg.Refresh), p.cfg.Name
	ps.mu.Unlock()
	timeout := min(refresh, MaxResolveTimeout)
	ctx, cancel := context.WithCancel(p.ctx)
	tm := ps.o.Clock.AfterFunc(timeout, cancel)
	ips, err := ps.o.Resolver.LookupNetIP(ctx, "ip", host)
	tm.Stop()
	cancel()
	if p.ctx.Err() != nil {
		return
	}
	var de *net.DNSError
	if err != nil && !(errors.As(err, &de) && de.IsNotFound) {
		ps.o.Metrics.failed(name)
		ps.o.Logger.Warn("engine pool: resolving failed; keeping the last good set", "pool", name, "dns", host, "err", err)
		return
	}
	ps.apply(p, ips)
}

// apply makes ips (one resolve's answer; none for a name not found) the pool's records.
func (ps *Pools) apply(p *pool, ips []netip.Addr) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	name := p.cfg.Name
	want := make(map[netip.AddrPort]bool, min(len(ips), config.MaxPoolWorkers)) // bounded below
	addrs := make([]netip.AddrPort, 0, len(ips))
	refused := 0
	for _, ip := range ips {
		ap := netip.AddrPortFrom(ip.Unmap(), p.port)
		if err := ps.o.Rules.HostPort(ap.String()); err != nil {
			refused++
			continue
		}
		addrs = append(addrs, ap)
	}
	slices.SortFunc(addrs, func(a, b netip.AddrPort) int { return a.Compare(b) })
	addrs = slices.Compact(addrs)
	over := max(0, len(addrs)-config.MaxPoolWorkers)
	addrs = addrs[:len(addrs)-over] // the lowest addresses: the same on every resolve and replica
	ps.o.Metrics.dropped(name, "refused", refused)
	ps.o.Metrics.dropped(name, "over_limit", over)
	if over != p.dropped {
		p.dropped = over
		if over > 0 {
			ps.o.Logger.Warn("engine pool: more records than a pool takes; the highest addresses are left out",
				"pool", name, "records", len(addrs)+over, "max", config.MaxPoolWorkers, "dropped", over)
		}
	}
	if refused > 0 {
		ps.o.Logger.Warn("engine pool: records refused by the engine address rules", "pool", name, "refused", refused)
	}
	if len(addrs) == 0 && !p.emptyOnce && p.active() > 0 {
		// One empty answer may be a hiccup (a DNS server restarting): keep the set until the
		// next resolve says the same.
		p.emptyOnce = true
		ps.o.Metrics.failed(name)
		ps.o.Logger.Warn("engine pool: no record; keeping the last set until the next resolve confirms it", "pool", name)
		return
	}
	p.emptyOnce = false
	for _, ap := range addrs {
		want[ap] = true
		switch m := p.members[ap]; {
		case m == nil:
			p.members[ap] = &member{}
		case m.draining:
			m.draining = false // back before its drain ended
		}
	}
	for ap, m := range p.members {
		if !want[ap] && !m.draining {
			ps.drainLocked(p, m)
		}
	}
	ps.boundDrainsLocked(p)
	ps.pushLocked()
}

func (ps *Pools) drainLocked(_ *pool, m *member) {
	m.draining, m.since = true, ps.o.Clock.Now()
}

// boundDrainsLocked retires the oldest draining members beyond config.MaxPoolWorkers of them
// at once (a name whose records churn faster than engines drain).
func (ps *Pools) boundDrainsLocked(p *pool) {
	var d []netip.AddrPort
	for ap, m := range p.members {
		if m.draining {
			d = append(d, ap)
		}
	}
	if len(d) <= config.MaxPoolWorkers {
		return
	}
	slices.SortFunc(d, func(a, b netip.AddrPort) int {
		return cmp.Or(p.members[a].since.Compare(p.members[b].since), a.Compare(b))
	})
	for _, ap := range d[:len(d)-config.MaxPoolWorkers] {
		delete(p.members, ap)
		ps.o.Fleet.Retire(config.PoolWorkerID(p.cfg.Name, ap.String()))
		ps.o.Metrics.dropped(p.cfg.Name, "drain_overflow", 1)
	}
}

// active counts the members not draining.
func (p *pool) active() int {
	n := 0
	for _, m := range p.members {
		if !m.draining {
			n++
		}
	}
	return n
}

// checkDrains ends the drains that are over: a draining member whose worker the router lists
// as draining with nothing in flight is retired; one it does not list (never registered, or
// evicted once its engine stopped answering) just leaves. It reports whether any member still
// drains.
func (ps *Pools) checkDrains(p *pool) bool {
	ps.mu.Lock()
	name := p.cfg.Name
	ids := make(map[string]netip.AddrPort) // the draining members: bounded by p.members
	for ap, m := range p.members {
		if m.draining {
			ids[config.PoolWorkerID(name, ap.String())] = ap
		}
	}
	ps.mu.Unlock()
	if len(ids) == 0 {
		return false
	}
	list, err := ps.o.Fleet.Workers()
	if err != nil {
		ps.o.Logger.Warn("engine pool: listing workers failed; drains are checked again later", "pool", name, "err", err)
		return true
	}
	listed := make(map[string]router.WorkerView, len(ids)) // bounded by ids
	for _, w := range list.Workers {
		if _, ok := ids[w.Info.ID]; ok {
			listed[w.Info.ID] = w
		}
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var retire []string
	for id, ap := range ids {
		m := p.members[ap]
		if m == nil || !m.draining {
			continue // back in the set meanwhile
		}
		w, ok := listed[id]
		switch {
		case !ok:
		case w.Info.Draining && w.InFlight == 0:
			retire = append(retire, id)
		default:
			continue // its draining scrape has not landed yet, or requests are in flight
		}
		delete(p.members, ap)
		ps.o.Logger.Info("engine pool: drained worker removed", "pool", name, "worker", id,
			"drained_for", ps.o.Clock.Now().Sub(m.since))
	}
	// The scrapers stop before the workers are retired, so no later scrape registers them again.
	ps.pushLocked()
	for _, id := range retire {
		ps.o.Fleet.Retire(id)
	}
	for _, m := range p.members {
		if m.draining {
			return true
		}
	}
	return false
}

// pushLocked hands every pool's targets to the scraper, and updates the workers gauge.
func (ps *Pools) pushLocked() {
	var all []scrape.Target
	for _, p := range ps.pools {
		active := 0
		for ap, m := range p.members {
			all = append(all, target(p.cfg, ap, m.draining))
			if !m.draining {
				active++
			}
		}
		ps.o.Metrics.workers(p.cfg.Name, active, len(p.members)-active)
	}
	slices.SortFunc(all, func(a, b scrape.Target) int { return cmp.Compare(a.ID, b.ID) })
	ps.o.Scraper.Set(all)
}

// target is the scrape target of pool c's record ap.
func target(c config.EnginePool, ap netip.AddrPort, draining bool) scrape.Target {
	return scrape.Target{
		ID: config.PoolWorkerID(c.Name, ap.String()), Model: c.Model, HTTPAddress: ap.String(), Role: c.Role,
		Kind: scrape.Kind(c.Metrics), Interval: time.Duration(c.ScrapeInterval), KVTotalBlocks: c.KVTotalBlocks,
		Endpoints: config.StaticEndpoints(c.Endpoints), KVEventsEndpoint: config.PoolKVEventsEndpoint(c.KVEventsEndpoint, ap.Addr()),
		BootstrapPort: c.BootstrapPort, Draining: draining, Series: c.Name,
	}
}
