package app

import (
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/gateway"
	"github.com/tlgw/tlgw/actors/registry"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/adapters/enginepool"
	"github.com/tlgw/tlgw/adapters/scrape"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/engineaddr"
)

// enginePools are [[gateway.engine_pools]] (R23): their own scrapers, whose reports register
// under registry.CredentialPool (no static worker can take a pool worker's id), and the
// resolver loops that set their targets.
type enginePools struct {
	pools *enginepool.Pools
	mgr   *scrape.Manager
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

// close stops the resolvers, then the scrapers they feed.
func (e *enginePools) close() {
	e.pools.Close()
	e.mgr.Close()
}

// poolFleet is what a pool's drain needs of the gateway.
type poolFleet struct{ gw *gateway.Gateway }

func (f poolFleet) Workers() (*router.WorkerList, error) { return f.gw.Workers() }
func (f poolFleet) Retire(id string)                     { f.gw.Retire(id, registry.CredentialPool) }
