package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// machineAddr is a non-loopback IPv4 address of this machine (the tests must be able to
// reach the gateway from an address that is not loopback, as another host would).
func machineAddr(t *testing.T) net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP
		}
	}
	t.Fatalf("this machine has no non-loopback IPv4 address to reach the gateway from: %v", addrs)
	return nil
}

// fetch sends method path to addr (host:port) from the local address from (nil: any) with the
// Host header host, and returns the status and body.
func fetch(t *testing.T, from net.IP, addr, method, path, host, body string) (int, string) {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	if from != nil {
		d.LocalAddr = &net.TCPAddr{IP: from}
	}
	tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b)
}

// TestOpenAdminAnswersOnlyLoopbackPeers (R20, issue 35's reproduction): a gateway listening on
// every address with no API keys (allow_unauthenticated) serves /admin only to a loopback peer.
// Another host that spoofs "Host: localhost" gets 403 for reads and for a route table write;
// the same requests from loopback are served.
func TestOpenAdminAnswersOnlyLoopbackPeers(t *testing.T) {
	from := machineAddr(t)
	gw := startTLGW(t, `
[gateway]
http_listen = "0.0.0.0:0"
registry_listen = "127.0.0.1:0"
allow_unauthenticated = true
`)
	_, port, err := net.SplitHostPort(gw.HTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	remote := net.JoinHostPort(from.String(), port)
	local := net.JoinHostPort("127.0.0.1", port)
	for _, host := range []string{"localhost", "127.0.0.1:" + port, "localhost:" + port} {
		if code, body := fetch(t, from, remote, "GET", "/admin/v1/workers", host, ""); code != 403 {
			t.Fatalf("GET /admin/v1/workers from %s with Host %s: %d %s, want 403", from, host, code, body)
		}
		if code, body := fetch(t, from, remote, "PUT", "/admin/v1/routes", host, `{"routes":[]}`); code != 403 {
			t.Fatalf("PUT /admin/v1/routes from %s with Host %s: %d %s, want 403", from, host, code, body)
		}
	}
	if code, body := fetch(t, nil, local, "GET", "/admin/v1/workers", "localhost", ""); code != 200 {
		t.Fatalf("GET /admin/v1/workers from loopback: %d %s, want 200", code, body)
	}
}

// TestLoopbackOpenGatewayChecksTheHostEverywhere (R20): a gateway on a loopback listener with
// no API keys answers only requests addressed to a loopback host, on every path — a web page
// that rebinds its DNS name to 127.0.0.1 reaches neither inference, nor metrics, nor admin.
func TestLoopbackOpenGatewayChecksTheHostEverywhere(t *testing.T) {
	gw := startTLGW(t, `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
`)
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/models", ""},
		{"POST", "/v1/completions", `{"model":"m","prompt":"hi"}`},
		{"GET", "/metrics", ""},
		{"GET", "/admin/v1/workers", ""},
	} {
		if code, body := fetch(t, nil, gw.HTTPAddr, c.method, c.path, "rebound.example:80", c.body); code != 403 {
			t.Fatalf("%s %s with Host rebound.example: %d %s, want 403", c.method, c.path, code, body)
		}
	}
	if code, body := fetch(t, nil, gw.HTTPAddr, "GET", "/v1/models", "localhost", ""); code != 200 {
		t.Fatalf("GET /v1/models with Host localhost: %d %s, want 200", code, body)
	}
}

// TestErrorsEchoAtMost64BytesOfInput (R20): an error answer repeats at most 64 bytes of what
// the client sent — a 404's path, a 405's method and path, an If-Match that is no ETag, an
// unknown field's name — so a 60 KB input is not mirrored back (the answers stay under 1 KiB).
func TestErrorsEchoAtMost64BytesOfInput(t *testing.T) {
	gw := startTLGW(t, `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
`)
	long := strings.Repeat("a", 60<<10)
	send := func(method, path, ifMatch, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, "http://"+gw.HTTPAddr+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if ifMatch != "" {
			req.Header.Set("If-Match", ifMatch)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 256<<10))
		return resp.StatusCode, string(b)
	}
	for _, c := range []struct {
		name                        string
		method, path, ifMatch, body string
		code                        int
	}{
		{"a long path", "GET", "/" + long, "", "", 404},
		{"a long path under admin", "GET", "/admin/v1/models/" + long + ":drain", "", "", 405},
		{"a long method", strings.ToUpper(long[:8<<10]), "/v1/models", "", "", 405},
		{"a long If-Match", "PUT", "/admin/v1/routes", `"` + long + `"`, `{"routes":[]}`, 412},
		{"a long unknown field", "PUT", "/admin/v1/routes", `"1"`, `{"` + long + `":1}`, 400},
	} {
		code, body := send(c.method, c.path, c.ifMatch, c.body)
		if code != c.code || len(body) > 1<<10 {
			t.Errorf("%s: %d, a %d-byte answer %.200q…; want %d and under 1 KiB", c.name, code, len(body), body, c.code)
		}
	}
}

// TestPlaintextRegistryTokensWarnOnce (R20): a registry that takes tokens over plaintext gRPC
// on every address says so once at start.
func TestPlaintextRegistryTokensWarnOnce(t *testing.T) {
	gw := startTLGW(t, `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "0.0.0.0:0"

[registry]
tokens = [{ token = "engine-secret" }]
`)
	_, _ = fetch(t, nil, gw.HTTPAddr, "GET", "/healthz", "localhost", "") // the log has its start lines
	if n := strings.Count(gw.Logs(), "registry tokens are accepted over plaintext"); n != 1 {
		t.Fatalf("the plaintext warning appears %d times, want once:\n%s", n, gw.Logs())
	}
	if strings.Contains(gw.Logs(), "engine-secret") {
		t.Fatal("the log repeats the token")
	}
}

// TestEngineHeadersStayBehind (R13.4, R20, issue 35: the engine's Content-Type was passed as
// is, so an engine answering text/html to a cross-site form POST ran script in the gateway's
// origin): a tlengine with --fault bad-headers labels every answer text/html and adds
// Set-Cookie, Location and X-TL-Route: spoofed. Through the gateway every answer is labelled
// by the gateway (application/json; a stream the engine mislabelled is relayed as a JSON
// answer, the engine's label deciding how its answer is read), with nosniff, and none of the
// engine's other headers.
func TestEngineHeadersStayBehind(t *testing.T) {
	f := startFleet(t, fastHeartbeats, []string{"e-bad", "--model", "smol", "--fault", "bad-headers"})
	for _, tc := range []struct{ body, want string }{
		{`{"model":"smol","prompt":"<script>alert(1)</script>","max_tokens":2}`, "application/json"},
		{`{"model":"smol","prompt":"<script>alert(1)</script>","max_tokens":2,"stream":true}`, "application/json"},
	} {
		req, _ := http.NewRequest("POST", f.base+"/v1/completions", strings.NewReader(tc.body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // as a cross-site form sends it
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		h := resp.Header
		if resp.StatusCode != 200 || !strings.HasPrefix(h.Get("Content-Type"), tc.want) || h.Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("%s: %d, Content-Type %q, X-Content-Type-Options %q; want 200, %s, nosniff",
				tc.body, resp.StatusCode, h.Get("Content-Type"), h.Get("X-Content-Type-Options"), tc.want)
		}
		for _, k := range []string{"Set-Cookie", "Location", "X-TL-Route"} {
			if v := h.Get(k); v != "" {
				t.Fatalf("%s: the engine's %s: %q reached the client", tc.body, k, v)
			}
		}
	}
}
