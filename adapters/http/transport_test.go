package httpapi_test

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	httpapi "github.com/tlgw/tlgw/adapters/http"
	"github.com/tlgw/tlgw/internal/dnstest"
	"github.com/tlgw/tlgw/internal/engineaddr"
)

// TestCheckedTransport (R20): the engine transport resolves a name with its resolver and
// checks the IP it resolved to before connecting: a name that resolves to a refused address
// fails as a dial error wrapping engineaddr.ErrRefused (a connection never made: the engine
// is unreachable), and the engine behind it sees nothing; an allowed one is reached.
func TestCheckedTransport(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1) }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	dns := dnstest.Start(t)
	dns.Set("engine.test", netip.MustParseAddr("127.0.0.1"))
	for _, refuse := range []bool{true, false} {
		tr := httpapi.NewCheckedTransport(engineaddr.Rules{RefuseLoopback: refuse}.Control, dns.Resolver())
		resp, err := (&http.Client{Transport: tr}).Get("http://engine.test:" + port + "/v1/models")
		if resp != nil {
			resp.Body.Close()
		}
		tr.CloseIdleConnections()
		var op *net.OpError
		switch {
		case refuse && (!errors.Is(err, engineaddr.ErrRefused) || !errors.As(err, &op) || op.Op != "dial" || hits.Load() != 0):
			t.Fatalf("a loopback name off loopback: %v, %d requests reached the engine", err, hits.Load())
		case !refuse && (err != nil || hits.Load() != 1):
			t.Fatalf("allowed: %v, %d requests", err, hits.Load())
		}
		if refuse && !strings.Contains(err.Error(), "the loopback address 127.0.0.1") {
			t.Fatalf("the refusal does not say why: %v", err)
		}
	}
}
