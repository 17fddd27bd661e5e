// Package engineaddr holds the host rules for addresses the gateway dials on an engine's word
// (SPEC R13.2, R20): a heartbeat's http_address, grpc_address and kv_address, and a static
// worker's http_address and metrics_url. The gateway pastes such an address into a URL or hands
// it to a gRPC dialler, so anything beyond a plain host:port could steer it elsewhere.
//
// The rules apply twice: to the address as written, when it is registered (HostPort, Host), and
// to the IP a connection is about to be made to, at dial time (Control): a DNS name is only
// resolved then, and may resolve (or rebind) to anything.
//
// Rules, worked through:
//
//	"10.0.0.5:8001"         ok
//	"engine-3.svc:8001"     ok (a DNS name; not resolved here)
//	"[2001:db8::1]:8001"    ok
//	"http://10.0.0.5:8001"  refused: a scheme
//	"10.0.0.5:8001/x?y"     refused: a path or query is not a port
//	"u@10.0.0.5:8001"       refused: userinfo is not a DNS name
//	"unix:8001"             refused: gRPC reads it as a unix socket
//	"169.254.169.254:80"    refused: link-local
//	"0.0.0.0:8001"          refused: unspecified
//	"10.0.0.5:0"            refused: port outside 1–65535
//
// With CIDRs set, an IP host must lie in one of them; a DNS name is not resolved by HostPort, so
// there CIDRs restrict IP addresses only, and Control applies them to what the name resolved to.
// With RefuseLoopback, loopback IPs (127.0.0.0/8, ::1) are refused too:
//
//	"127.0.0.1:2379"        refused (an etcd member, the gateway's own ports)
//	"localhost:2379"        ok as written; refused by Control when it resolves to 127.0.0.1
package engineaddr

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
)

// MaxPart is the longest host, or port, accepted, in bytes.
const MaxPart = 256

// Rules checks engine addresses. The zero value allows any IP network but link-local and
// unspecified addresses.
type Rules struct {
	// CIDRs, when not empty, are the networks an IP host must lie in ([registry] engine_cidrs).
	CIDRs []netip.Prefix
	// RefuseLoopback refuses loopback IPs: set when the registry listens off loopback and
	// [registry] allow_loopback_engines is not set, since an engine on another host has no
	// business naming the gateway's own host (its ports, an etcd member beside it). A registry
	// on loopback (the demo, a laptop, the tests) takes loopback engines.
	RefuseLoopback bool
}

// ErrRefused marks a connection Control refused: the address it resolved to breaks the rules.
var ErrRefused = errors.New("engine address refused")

// ParseCIDRs parses engine_cidrs entries; the error names the first bad one.
func ParseCIDRs(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR such as 10.0.0.0/8", s)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// grpcSchemes are the resolver schemes gRPC registers by default: "unix:80" would dial a
// unix socket named 80, not the host unix.
var grpcSchemes = map[string]bool{"unix": true, "unix-abstract": true, "dns": true, "passthrough": true}

// HostPort checks a host:port address.
func (r Rules) HostPort(s string) error {
	if s == "" {
		return errors.New("is empty")
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%s is not host:port", quote(s))
	}
	if err := checkPort(port); err != nil {
		return fmt.Errorf("%s: %w", quote(s), err)
	}
	if err := r.Host(host); err != nil {
		return fmt.Errorf("%s: %w", quote(s), err)
	}
	return nil
}

// Host checks a host alone: an IP address (IPv6 without brackets) or a DNS name.
func (r Rules) Host(host string) error {
	if host == "" {
		return errors.New("the host is empty")
	}
	if len(host) > MaxPart {
		return fmt.Errorf("the host is longer than %d bytes", MaxPart)
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return r.ip(ip)
	}
	if grpcSchemes[strings.ToLower(host)] {
		return fmt.Errorf("the host %q is a gRPC resolver scheme", host)
	}
	if !dnsName(host) {
		return fmt.Errorf("the host %s is neither an IP address nor a DNS name", quote(host))
	}
	return nil
}

func (r Rules) ip(ip netip.Addr) error {
	if ip.Zone() != "" {
		return errors.New("an IPv6 zone is not allowed")
	}
	ip = ip.Unmap()
	switch {
	case ip.IsUnspecified():
		return fmt.Errorf("the unspecified address %s is not allowed", ip)
	case ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast():
		return fmt.Errorf("the link-local address %s is not allowed", ip)
	case r.RefuseLoopback && ip.IsLoopback():
		return fmt.Errorf("the loopback address %s is not allowed: the registry listens off loopback (see [registry] allow_loopback_engines)", ip)
	}
	if len(r.CIDRs) == 0 {
		return nil
	}
	for _, p := range r.CIDRs {
		if p.Contains(ip) {
			return nil
		}
	}
	return fmt.Errorf("%s is outside [registry] engine_cidrs", ip)
}

// Control is a net.Dialer's Control function (R20): it checks the IP and port a TCP connection
// is about to be made to — after name resolution, so a DNS name that resolves or rebinds to a
// refused address is caught here, whatever it said at registration — under the same rules as
// Host. Its error wraps ErrRefused; the dialer returns it as a *net.OpError whose Op is "dial",
// so the connection counts as never made. Nothing but TCP is dialled.
//
//	Control("tcp4", "10.0.0.5:8001", c)        nil
//	Control("tcp4", "169.254.169.254:80", c)   refused: link-local (a name that resolved there)
//	Control("tcp6", "[::1]:8001", c)           refused with RefuseLoopback
//	Control("udp", "10.0.0.5:53", c)           refused: not TCP
func (r Rules) Control(network, address string, _ syscall.RawConn) error {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return fmt.Errorf("%w: network %s is not TCP", ErrRefused, quote(network))
	}
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: %s is not an IP address and port", ErrRefused, quote(address))
	}
	if ap.Port() == 0 {
		return fmt.Errorf("%w: %s: the port must be 1–65535", ErrRefused, quote(address))
	}
	if err := r.ip(ap.Addr()); err != nil {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return nil
}

func checkPort(port string) error {
	if port == "" || len(port) > 5 {
		return errors.New("the port must be 1–65535")
	}
	for i := 0; i < len(port); i++ {
		if port[i] < '0' || port[i] > '9' {
			return errors.New("the port must be 1–65535")
		}
	}
	if n, _ := strconv.Atoi(port); n < 1 || n > 65535 {
		return errors.New("the port must be 1–65535")
	}
	return nil
}

// dnsName reports whether s is dot-separated labels of letters, digits, '-' and '_' (each
// 1–63 bytes, not starting or ending with '-'), with an optional final dot.
func dnsName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" {
		return false
	}
	for label := range strings.SplitSeq(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// quote shows an address in a message, cut to a readable length.
func quote(s string) string {
	if len(s) > 80 {
		return strconv.Quote(s[:80]) + "…"
	}
	return strconv.Quote(s)
}
