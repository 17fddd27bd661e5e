package httpapi

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestLoopbackPeerAndListener (R20): only the connection's addresses decide who is on this
// machine — a loopback peer or listener address (IPv4, IPv6, IPv4-mapped); anything else, an
// address that does not parse, and a request with no listener address are not loopback.
func TestLoopbackPeerAndListener(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:5000": true, "127.9.9.9:1": true, "[::1]:80": true, "[::ffff:127.0.0.1]:80": true,
		"192.0.2.2:5000": false, "[2001:db8::1]:80": false,
	} {
		if got := loopbackPeer(addr); got != want {
			t.Errorf("loopbackPeer(%q) = %v, want %v", addr, got, want)
		}
		a, err := net.ResolveTCPAddr("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest("GET", "/", nil)
		r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, net.Addr(a)))
		if got := loopbackListener(r); got != want {
			t.Errorf("loopbackListener(%q) = %v, want %v", addr, got, want)
		}
	}
	for _, addr := range []string{"localhost:80", "127.0.0.1", ""} {
		if loopbackPeer(addr) {
			t.Errorf("loopbackPeer(%q) = true for an address that is no ip:port", addr)
		}
	}
	if loopbackListener(httptest.NewRequest("GET", "/", nil)) {
		t.Error("a request with no listener address counts as loopback")
	}
}
