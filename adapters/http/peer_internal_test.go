package httpapi

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestLoopbackPeerAndListener (R20): only the connection's addresses decide who is on this
// machine — a loopback peer (IPv4, IPv6, IPv4-mapped) and a loopback listener; anything else,
// and an address that does not parse, is not loopback.
func TestLoopbackPeerAndListener(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:5000": true, "127.9.9.9:1": true, "[::1]:80": true, "[::ffff:127.0.0.1]:80": true,
		"192.0.2.2:5000": false, "[2001:db8::1]:80": false, "localhost:80": false, "127.0.0.1": false, "": false,
	} {
		if got := loopbackPeer(addr); got != want {
			t.Errorf("loopbackPeer(%q) = %v, want %v", addr, got, want)
		}
		r := httptest.NewRequest("GET", "/", nil)
		if a, err := net.ResolveTCPAddr("tcp", addr); err == nil && addr != "localhost:80" {
			r = r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, net.Addr(a)))
		}
		if got := loopbackListener(r); got != want && addr != "127.0.0.1" && addr != "" && addr != "localhost:80" {
			t.Errorf("loopbackListener(%q) = %v, want %v", addr, got, want)
		}
	}
	if loopbackListener(httptest.NewRequest("GET", "/", nil)) {
		t.Error("a request with no listener address counts as loopback")
	}
}
