// Package dnstest is a DNS server on loopback for tests: it answers A and AAAA questions from a
// table the test sets (and may change, as a rebinding name would), so code that dials engine
// names can be tested against names that resolve anywhere, with no network and no /etc/hosts.
package dnstest

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// Server answers for the names in its table; any other name is NXDOMAIN.
type Server struct {
	pc  net.PacketConn
	wg  sync.WaitGroup
	mu  sync.Mutex
	ips map[string][]netip.Addr // by lower-case name without the final dot; set by Set
}

// Start runs a server on a loopback UDP port until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{pc: pc, ips: make(map[string][]netip.Addr)}
	s.wg.Add(1)
	go s.serve()
	t.Cleanup(func() {
		pc.Close()
		s.wg.Wait()
	})
	return s
}

// Set makes name resolve to ips (none: NXDOMAIN).
func (s *Server) Set(name string, ips ...netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ips[canonical(name)] = ips
}

// Resolver is a Go resolver that asks this server only.
func (s *Server) Resolver() *net.Resolver {
	addr := s.pc.LocalAddr().String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", addr)
	}}
}

func canonical(name string) string { return strings.ToLower(strings.TrimSuffix(name, ".")) }

func (s *Server) serve() {
	defer s.wg.Done()
	buf := make([]byte, 512)
	for {
		n, from, err := s.pc.ReadFrom(buf)
		if err != nil {
			return // closed
		}
		if out, ok := s.answer(buf[:n]); ok {
			_, _ = s.pc.WriteTo(out, from)
		}
	}
}

// answer builds the reply to one query; false for a packet that is not one.
func (s *Server) answer(query []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil, false
	}
	q, err := p.Question()
	if err != nil {
		return nil, false
	}
	s.mu.Lock()
	ips, known := s.ips[canonical(q.Name.String())]
	s.mu.Unlock()
	rh := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired}
	if !known || len(ips) == 0 {
		rh.RCode = dnsmessage.RCodeNameError
	}
	b := dnsmessage.NewBuilder(nil, rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil, false
	}
	res := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 0}
	for _, ip := range ips {
		switch {
		case q.Type == dnsmessage.TypeA && ip.Is4():
			if b.AResource(res, dnsmessage.AResource{A: ip.As4()}) != nil {
				return nil, false
			}
		case q.Type == dnsmessage.TypeAAAA && ip.Is6():
			if b.AAAAResource(res, dnsmessage.AAAAResource{AAAA: ip.As16()}) != nil {
				return nil, false
			}
		}
	}
	out, err := b.Finish()
	return out, err == nil
}
