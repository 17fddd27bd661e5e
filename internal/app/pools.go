package app

import (
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/gateway"
	"github.com/tlgw/tlgw/actors/registry"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/adapters/enginepool"
	"github.com/tlgw/tlgw/adapters/scrape"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/engineaddr"
	"github.com/tlgw/tlgw/internal/errs"
)

// enginePools are [[gateway.engine_pools]] (R23): their own scrapers, whose reports register
// under registry.CredentialPool (no static worker can take a pool worker's id), the resolver
// loops that set their targets, and the table behind GET/PUT /admin/v1/engine-pools with its
// epoch for If-Match (in a cluster, the table's key revision in etcd).
type enginePools struct {
	pools *enginepool.Pools
	mgr   *scrape.Manager

	mu    sync.Mutex // guards epoch and table, and orders the calls into pools.Set
	epoch uint64
	table []config.EnginePool // at most config.MaxEnginePools (validated)
}

func newEnginePools(gw *gateway.Gateway, clk clock.Clock, reg prometheus.Registerer, rules engineaddr.Rules, res *net.Resolver, log *slog.Logger) *enginePools {
	mgr := scrape.NewManager(scrapeSink{gw: gw, cred: registry.CredentialPool}, clk, reg, scrape.WithDialControl(rules.Control, res))
	var r enginepool.Resolver = net.DefaultResolver
	if res != nil {
		r = res
	}
	return &enginePools{mgr: mgr, pools: enginepool.New(enginepool.Options{
		Resolver: r, Scraper: mgr, Fleet: poolFleet{gw}, Rules: rules, Clock: clk,
		Logger: log.With("component", "engine_pools"), Metrics: enginepool.NewMetrics(reg),
	})}
}

// start installs the configured table as epoch 1.
func (e *enginePools) start(table []config.EnginePool) { e.install(1, table) }

// install sets the table at epoch rev (in a cluster, as the store read it: R16, R23).
func (e *enginePools) install(rev uint64, table []config.EnginePool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.epoch, e.table = rev, table
	e.pools.Set(table)
}

func (e *enginePools) EnginePools() (uint64, []config.EnginePool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.epoch, append([]config.EnginePool(nil), e.table...)
}

// put replaces the table of one process if ifMatch is its epoch.
func (e *enginePools) put(ifMatch uint64, table []config.EnginePool) (uint64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if ifMatch != e.epoch {
		return 0, fmt.Errorf("the engine pool table is at epoch %d, If-Match names %d: %w", e.epoch, ifMatch, errs.ErrEtagMismatch)
	}
	e.epoch++
	e.table = table
	e.pools.Set(table)
	return e.epoch, nil
}

// close stops the resolvers, then the scrapers they feed.
func (e *enginePools) close() {
	e.pools.Close()
	e.mgr.Close()
}

// poolTable is the engine pool table behind the admin API: PUTs go to this process's pools,
// or to etcd in a cluster (store set; every replica then installs the table from its watch).
// A table whose pool would hold a static worker's id is refused, as the configuration is.
type poolTable struct {
	*enginePools
	static *staticWorkers
	app    *App // nil without [cluster]
}

func (t poolTable) PutEnginePools(ifMatch uint64, table []config.EnginePool) (uint64, error) {
	_, ws := t.static.StaticWorkers()
	if err := config.PoolIDConflict(ws, table); err != nil {
		return 0, fmt.Errorf("%v: %w", err, errs.ErrInvalidEnginePool)
	}
	if t.app != nil {
		return t.app.store.PutPools(ifMatch, table)
	}
	return t.put(ifMatch, table)
}

// poolFleet is what a pool's drain needs of the gateway.
type poolFleet struct{ gw *gateway.Gateway }

func (f poolFleet) Workers() (*router.WorkerList, error) { return f.gw.Workers() }
func (f poolFleet) Retire(id string)                     { f.gw.Retire(id, registry.CredentialPool) }
