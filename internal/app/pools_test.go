package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/etcdtest"
	"github.com/tlgw/tlgw/internal/gwtest"
)

// noDNS is a resolver that answers nothing and never leaves the process: a pool's lookups
// fail and it keeps its (empty) set, which is all these tests need of them.
var noDNS = &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
	return nil, errors.New("no DNS in this test")
}}

type poolsView struct {
	status int
	etag   string
	code   string // the error code of a refusal
	names  []string
}

// poolsAdmin does one request on /admin/v1/engine-pools; hdr are header name, value pairs.
func poolsAdmin(t *testing.T, a *app.App, method, body string, hdr ...string) poolsView {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+a.HTTPAddr+"/admin/v1/engine-pools", strings.NewReader(body))
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Epoch uint64 `json:"epoch"`
		Pools []struct {
			Name string `json:"name"`
		} `json:"engine_pools"`
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	v := poolsView{status: resp.StatusCode, etag: resp.Header.Get("ETag"), code: doc.Error.Code, names: []string{}}
	for _, p := range doc.Pools {
		v.names = append(v.names, p.Name)
	}
	return v
}

// poolGauges lists the pools a replica runs, from tlgw_engine_pool_workers.
func poolGauges(t *testing.T, a *app.App) []string {
	t.Helper()
	mfs, err := a.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "tlgw_engine_pool_workers" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "pool" && !slices.Contains(out, l.GetValue()) {
					out = append(out, l.GetValue())
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

func poolCfg(name string) config.EnginePool {
	return config.EnginePool{Name: name, Model: "m", DNS: name + ".test:8000", Metrics: "vllm"}
}

// TestEnginePoolsAdmin (R23): without [cluster], GET/PUT /admin/v1/engine-pools follow the
// static workers' discipline (428, 412, 400 invalid_engine_pool, 200 with a new ETag) and a
// PUT table is run at once.
func TestEnginePoolsAdmin(t *testing.T) {
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Gateway.EnginePools = config.NormalizeEnginePools([]config.EnginePool{poolCfg("alpha")})
	a, err := app.Start(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Resolver: noDNS})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(context.Background())
	v := poolsAdmin(t, a, "GET", "")
	if v.status != 200 || v.etag != `"1"` || !slices.Equal(v.names, []string{"alpha"}) {
		t.Fatalf("GET %+v", v)
	}
	table := `{"engine_pools":[{"name":"beta","model":"m","dns":"beta.test:8000","metrics":"sglang"}]}`
	if v := poolsAdmin(t, a, "PUT", table); v.status != 428 || v.code != "if_match_required" {
		t.Fatalf("PUT without If-Match: %+v", v)
	}
	if v := poolsAdmin(t, a, "PUT", table, "If-Match", `"7"`); v.status != 412 || v.code != "etag_mismatch" {
		t.Fatalf("stale PUT: %+v", v)
	}
	v = poolsAdmin(t, a, "PUT", table, "If-Match", `"1"`)
	if v.status != 200 || v.etag != `"2"` || !slices.Equal(v.names, []string{"beta"}) {
		t.Fatalf("PUT %+v", v)
	}
	gwtest.Eventually(t, "beta runs and alpha ends", func() bool { return slices.Equal(poolGauges(t, a), []string{"beta"}) })
}

// TestEnginePoolsSharedByReplicas (R16, R23): the first replica seeds the pool table; a PUT on
// one replica is run by the other at the same ETag; a bad table is refused (400) and a stale
// If-Match 412 on either replica, and neither changes anything anywhere.
func TestEnginePoolsSharedByReplicas(t *testing.T) {
	etcd := etcdtest.Start(t)
	start := func(id string, pools []config.EnginePool) *app.App {
		cfg := config.Default()
		cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
		cfg.Registry.EngineCIDRs = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
		cfg.Gateway.EnginePools = config.NormalizeEnginePools(pools)
		// A static worker whose id a pool named "delta" would hold (its scrapes fail: no engine).
		cfg.Gateway.StaticWorkers = config.NormalizeStaticWorkers([]config.StaticWorker{{ID: "delta/w", Model: "m", HTTPAddress: "127.0.0.1:1", Metrics: "vllm"}})
		cfg.Cluster = config.Cluster{Enabled: true, EtcdEndpoints: []string{etcd.Endpoint()}, Prefix: "/pools/", ReplicaID: id, LeaseTTL: 2 * time.Second}
		a, err := app.Start(cfg, app.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Resolver: noDNS})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Shutdown(context.Background()) })
		gwtest.Eventually(t, id+" follows etcd", func() bool { return getReplicas(t, a).StoreUp })
		return a
	}
	a := start("a", []config.EnginePool{poolCfg("alpha")})
	b := start("b", []config.EnginePool{poolCfg("beta")})
	va := poolsAdmin(t, a, "GET", "")
	gwtest.Eventually(t, "b takes the stored table", func() bool {
		vb := poolsAdmin(t, b, "GET", "")
		return vb.etag == va.etag && slices.Equal(vb.names, []string{"alpha"})
	})
	gwtest.Eventually(t, "b runs alpha, not its own beta", func() bool { return slices.Equal(poolGauges(t, b), []string{"alpha"}) })

	put := poolsAdmin(t, b, "PUT", `{"engine_pools":[{"name":"gamma","model":"m","dns":"gamma.test:8000","metrics":"vllm"}]}`, "If-Match", va.etag)
	if put.status != 200 || put.etag == va.etag || !slices.Equal(put.names, []string{"gamma"}) {
		t.Fatalf("PUT on b: %+v", put)
	}
	for _, r := range []*app.App{a, b} {
		gwtest.Eventually(t, "the PUT is applied on both replicas", func() bool {
			v := poolsAdmin(t, r, "GET", "")
			return v.etag == put.etag && slices.Equal(v.names, []string{"gamma"}) && slices.Equal(poolGauges(t, r), []string{"gamma"})
		})
	}

	for _, c := range []struct {
		what, body, ifMatch string
		status              int
		code                string
	}{
		{"stale If-Match", `{"engine_pools":[]}`, va.etag, 412, "etag_mismatch"},
		{"an IP for dns", `{"engine_pools":[{"name":"x","model":"m","dns":"10.0.0.1:8000","metrics":"vllm"}]}`, put.etag, 400, "invalid_engine_pool"},
		{"a name used twice", `{"engine_pools":[` + strings.Repeat(`{"name":"x","model":"m","dns":"x.test:8000","metrics":"vllm"},`, 2) + `{"name":"y","model":"m","dns":"y.test:1","metrics":"vllm"}]}`, put.etag, 400, "invalid_engine_pool"},
		{"an unknown field", `{"engine_pools":[{"name":"x","model":"m","dns":"x.test:8000","metrics":"vllm","dsn":"x"}]}`, put.etag, 400, "invalid_engine_pool"},
		{"a static worker's ids", `{"engine_pools":[{"name":"delta","model":"m","dns":"delta.test:8000","metrics":"vllm"}]}`, put.etag, 400, "invalid_engine_pool"},
	} {
		if v := poolsAdmin(t, a, "PUT", c.body, "If-Match", c.ifMatch); v.status != c.status || v.code != c.code {
			t.Fatalf("%s: %+v, want %d %s", c.what, v, c.status, c.code)
		}
	}
	for _, r := range []*app.App{a, b} {
		if v := poolsAdmin(t, r, "GET", ""); v.etag != put.etag || !slices.Equal(v.names, []string{"gamma"}) {
			t.Fatalf("a refused PUT changed the table: %+v", v)
		}
	}

	// Nor may a static worker table take a pool's ids.
	base := "http://" + a.HTTPAddr + "/admin/v1/static-workers"
	resp, err := http.Get(base)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	req, _ := http.NewRequest("PUT", base, strings.NewReader(`{"static_workers":[{"id":"gamma/w","model":"m","http_address":"127.0.0.1:1","metrics":"vllm"}]}`))
	req.Header.Set("If-Match", resp.Header.Get("ETag"))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(body), "invalid_static_worker") || !strings.Contains(string(body), `engine pool \"gamma\"`) {
		t.Fatalf("a static worker in pool gamma's ids: %d %s", resp.StatusCode, body)
	}
}
