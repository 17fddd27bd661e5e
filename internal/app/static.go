package app

import (
	"fmt"
	"sync"
	"time"

	"github.com/tlgw/tlgw/actors/gateway"
	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/adapters/scrape"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/engineaddr"
	"github.com/tlgw/tlgw/internal/errs"
)

// staticWorkers is the table of static workers ([[gateway.static_workers]] and
// PUT /admin/v1/static-workers): its epoch for If-Match, and the scrapers that feed the
// registry. A worker dropped from the table is no longer scraped and leaves routing when its
// k·scrape_interval deadline passes, like any worker that stops reporting.
type staticWorkers struct {
	mu    sync.Mutex
	epoch uint64
	ws    []config.StaticWorker
	mgr   *scrape.Manager
	rules engineaddr.Rules // the configuration's engine rules, which a PUT table follows (R20)
	pools *enginePools     // whose ids a PUT table must stay out of (R23)
}

// poolConflict refuses a table with a worker inside an engine pool's ids.
func (s *staticWorkers) poolConflict(ws []config.StaticWorker) error {
	_, ps := s.pools.EnginePools()
	if err := config.PoolIDConflict(ws, ps); err != nil {
		return fmt.Errorf("%v: %w", err, errs.ErrInvalidStaticWorker)
	}
	return nil
}

// start installs the configured table as epoch 1.
func (s *staticWorkers) start(ws []config.StaticWorker) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch, s.ws = 1, ws
	s.mgr.Set(targets(ws))
}

// install sets the table at epoch rev as the cluster's store read it (R16).
func (s *staticWorkers) install(rev uint64, ws []config.StaticWorker) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.epoch, s.ws = rev, ws
	s.mgr.Set(targets(ws))
}

func (s *staticWorkers) StaticWorkers() (uint64, []config.StaticWorker) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.epoch, append([]config.StaticWorker(nil), s.ws...)
}

func (s *staticWorkers) PutStaticWorkers(ifMatch uint64, ws []config.StaticWorker) (uint64, error) {
	if err := config.StaticWorkerAddresses(ws, s.rules); err != nil {
		return 0, fmt.Errorf("%v: %w", err, errs.ErrInvalidStaticWorker)
	}
	if err := s.poolConflict(ws); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ifMatch != s.epoch {
		return 0, fmt.Errorf("the static worker table is at epoch %d, If-Match names %d: %w", s.epoch, ifMatch, errs.ErrEtagMismatch)
	}
	s.epoch++
	s.ws = ws
	s.mgr.Set(targets(ws))
	return s.epoch, nil
}

func targets(ws []config.StaticWorker) []scrape.Target {
	out := make([]scrape.Target, 0, len(ws))
	for _, w := range ws {
		out = append(out, scrape.Target{
			ID: w.ID, Model: w.Model, HTTPAddress: w.HTTPAddress, Role: w.Role,
			Kind: scrape.Kind(w.Metrics), MetricsURL: w.MetricsURL,
			Interval: time.Duration(w.ScrapeInterval), KVTotalBlocks: w.KVTotalBlocks,
			Endpoints: config.StaticEndpoints(w.Endpoints), KVEventsEndpoint: w.KVEventsEndpoint,
			BootstrapPort: w.BootstrapPort,
		})
	}
	return out
}

// scrapeSink turns scrapes into the registry's heartbeats (R1 with the last successful scrape
// in place of the last heartbeat). The scraper has held the LoRA names to a heartbeat's rules
// (R21); the endpoints are the table's.
// cred is the registry credential of the reports: the static workers' or the engine
// pools' (R23).
type scrapeSink struct {
	gw   *gateway.Gateway
	cred string
}

var roleOf = map[string]router.Role{"unified": router.RoleUnified, "prefill": router.RolePrefill, "decode": router.RoleDecode}

func (s scrapeSink) Scraped(t scrape.Target, st scrape.Status) {
	info := router.WorkerInfo{
		ID: t.ID, Model: t.Model, Role: roleOf[t.Role], HTTPAddress: t.HTTPAddress,
		QueueDepth: st.QueueDepth, Running: st.Running, KVFreeBlocks: st.KVFreeBlocks,
		KVTotalBlocks: st.KVTotalBlocks, BlockSize: st.BlockSize, Static: true,
		LoRAAdapters: st.LoRAAdapters, MaxLoRAs: st.MaxLoRAs, RunningLoRAs: st.RunningLoRAs,
		MaxModelLen: st.MaxModelLen, Endpoints: t.Endpoints, KVEventsEndpoint: t.KVEventsEndpoint,
		BootstrapPort: t.BootstrapPort, Draining: t.Draining,
	}
	_ = s.gw.ScrapedAs(s.cred, info, time.Duration(s.gw.MissLimit())*t.Interval)
}

func (s scrapeSink) Failed(t scrape.Target, reason string, _ error) {
	s.gw.ScrapeFailed(t.ID, reason)
}
