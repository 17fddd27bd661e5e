package engineaddr

import (
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

func TestHostPort(t *testing.T) {
	long := strings.Repeat("a", 60) + "." + strings.Repeat("b", 60) + "." + strings.Repeat("c", 60) + "." + strings.Repeat("d", 60) + "." + strings.Repeat("e", 60)
	tests := []struct {
		addr string
		ok   bool
	}{
		{"10.0.0.5:8001", true},
		{"127.0.0.1:1", true},
		{"127.0.0.1:65535", true},
		{"engine-3.svc.cluster.local:8001", true},
		{"engine_3.internal.:8001", true},
		{"localhost:8001", true},
		{"[2001:db8::1]:8001", true},
		{"[::1]:8001", true},
		{"", false},
		{"10.0.0.5", false},
		{"10.0.0.5:", false},
		{":8001", false},
		{"http://10.0.0.5:8001", false},
		{"10.0.0.5:8001/path", false},
		{"10.0.0.5:8001?x=1", false},
		{"10.0.0.5:80#f", false},
		{"user@10.0.0.5:8001", false},
		{"user:pw@10.0.0.5:8001", false},
		{"unix:8001", false},
		{"UNIX:8001", false},
		{"unix:/tmp/engine.sock", false},
		{"unix-abstract:8001", false},
		{"dns:8001", false},
		{"passthrough:8001", false},
		{"169.254.169.254:80", false},
		{"169.254.0.1:8001", false},
		{"[fe80::1]:8001", false},
		{"[febf::1]:8001", false},
		{"[fe80::1%eth0]:8001", false},
		{"[::ffff:169.254.169.254]:80", false},
		{"0.0.0.0:8001", false},
		{"[::]:8001", false},
		{"10.0.0.5:0", false},
		{"10.0.0.5:65536", false},
		{"10.0.0.5:+80", false},
		{"10.0.0.5:-1", false},
		{"10.0.0.5:080000", false},
		{"10.0.0.5:http", false},
		{"-bad.example:80", false},
		{"bad..example:80", false},
		{"sp ace:80", false},
		{"%2e%2e:80", false},
		{long + ":80", false},
		{strings.Repeat("a", 63) + ":80", true},
		{strings.Repeat("a", 64) + ":80", false},
	}
	for _, tt := range tests {
		err := Rules{}.HostPort(tt.addr)
		if (err == nil) != tt.ok {
			t.Errorf("HostPort(%q) = %v, want ok=%v", tt.addr, err, tt.ok)
		}
	}
}

// TestHostBoundaries: the edges of the host and port rules, byte by byte.
func TestHostBoundaries(t *testing.T) {
	label := strings.Repeat("a", 63)
	atMax := label + "." + label + "." + label + "." + label + "." // MaxPart bytes, a valid name
	if len(atMax) != MaxPart {
		t.Fatalf("len %d", len(atMax))
	}
	for _, tt := range []struct {
		host string
		ok   bool
	}{
		{atMax, true},
		{label + "." + label + "." + label + "." + label + ".b", false}, // MaxPart + 1 bytes
		{"az.AZ.09.a-b.a_b", true},
		{"a`b", false}, {"a{b", false}, // around a–z
		{"a@b", false}, {"a[b", false}, // around A–Z
		{"a/b", false}, {"a:b", false}, // around 0–9
		{"a,b", false}, {"a.b-", false},
	} {
		if err := (Rules{}).Host(tt.host); (err == nil) != tt.ok {
			t.Errorf("Host(%q) = %v, want ok=%v", tt.host, err, tt.ok)
		}
	}
	for _, tt := range []struct {
		port string
		ok   bool
	}{
		{"9", true}, {"9999", true}, {"10000", true}, {"99999", false}, {"100000", false},
		{"8/", false}, {"8:", false},
	} {
		if err := (Rules{}).HostPort("10.0.0.5:" + tt.port); (err == nil) != tt.ok {
			t.Errorf("port %q: %v, want ok=%v", tt.port, err, tt.ok)
		}
	}
	// A message quotes at most 80 bytes of an address.
	for _, n := range []int{80, 81} {
		addr := strings.Repeat("x", n)
		err := (Rules{}).HostPort(addr)
		want := strconv.Quote(addr) + " is not host:port"
		if n > 80 {
			want = strconv.Quote(addr[:80]) + "… is not host:port"
		}
		if err == nil || err.Error() != want {
			t.Errorf("%d bytes: %v, want %s", n, err, want)
		}
	}
}

func TestCIDRs(t *testing.T) {
	cidrs, err := ParseCIDRs([]string{"10.0.0.0/8", "fd00::/8", "192.168.1.7/24"})
	if err != nil {
		t.Fatal(err)
	}
	r := Rules{CIDRs: cidrs}
	for addr, ok := range map[string]bool{
		"10.1.2.3:80":         true,
		"[fd00::5]:80":        true,
		"192.168.1.200:80":    true,
		"[::ffff:10.0.0.1]:1": true,
		"192.168.2.1:80":      false,
		"127.0.0.1:80":        false,
		"[2001:db8::1]:80":    false,
		"engine.internal:80":  true, // DNS names are not resolved: CIDRs restrict IP addresses
	} {
		if err := r.HostPort(addr); (err == nil) != ok {
			t.Errorf("HostPort(%q) = %v, want ok=%v", addr, err, ok)
		}
	}
	if _, err := ParseCIDRs([]string{"10.0.0.0/33"}); err == nil {
		t.Error("10.0.0.0/33 parsed")
	}
	if _, err := ParseCIDRs([]string{"nonsense"}); err == nil {
		t.Error("nonsense parsed")
	}
}

// FuzzHostPort: an accepted address always splits into a host and a port in range, carries
// nothing that a URL would read as scheme, userinfo, path, query or fragment, and names no
// link-local or unspecified IP.
func FuzzHostPort(f *testing.F) {
	for _, s := range []string{"10.0.0.5:8001", "[::1]:80", "a.b:1", "http://x:1", "169.254.169.254:80", "unix:1", "x@y:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if (Rules{}).HostPort(s) != nil {
			return
		}
		host, port, err := net.SplitHostPort(s)
		if err != nil || host == "" || port == "" || len(host) > MaxPart {
			t.Fatalf("accepted %q: %q %q %v", s, host, port, err)
		}
		if strings.ContainsAny(s, "/?#@ %\\") || strings.Contains(s, "://") {
			t.Fatalf("accepted %q with URL syntax", s)
		}
		if ip, err := netip.ParseAddr(host); err == nil {
			ip = ip.Unmap()
			if ip.IsUnspecified() || ip.IsLinkLocalUnicast() {
				t.Fatalf("accepted %q", s)
			}
		}
	})
}

// TestRefuseLoopback (R20): a registry off loopback refuses loopback IPs as written (also
// IPv4-mapped), so an engine elsewhere cannot point the gateway at its own host; a DNS name is
// left to Control, and without RefuseLoopback loopback is an address like any other.
func TestRefuseLoopback(t *testing.T) {
	off := Rules{RefuseLoopback: true}
	for addr, ok := range map[string]bool{
		"127.0.0.1:2379":        false,
		"127.255.255.254:80":    false,
		"[::1]:8001":            false,
		"[::ffff:127.0.0.1]:80": false,
		"128.0.0.1:80":          true,
		"126.255.255.255:80":    true,
		"[::2]:80":              true,
		"localhost:2379":        true, // a name: checked where it resolves (Control)
		"10.0.0.5:8001":         true,
	} {
		if err := off.HostPort(addr); (err == nil) != ok {
			t.Errorf("HostPort(%q) = %v, want ok=%v", addr, err, ok)
		}
		if err := (Rules{}).HostPort(addr); err != nil {
			t.Errorf("without RefuseLoopback, HostPort(%q) = %v", addr, err)
		}
	}
	cidrs, _ := ParseCIDRs([]string{"127.0.0.0/8"})
	if err := (Rules{CIDRs: cidrs, RefuseLoopback: true}).HostPort("127.0.0.1:80"); err == nil {
		t.Error("engine_cidrs that hold loopback let it in off loopback")
	}
}

// TestControl (R20): at dial time the rules apply to the resolved IP and port: link-local and
// unspecified always refused, loopback with RefuseLoopback, engine_cidrs applied; every refusal
// wraps ErrRefused, and only TCP is dialled.
func TestControl(t *testing.T) {
	cidrs, _ := ParseCIDRs([]string{"10.0.0.0/8", "127.0.0.0/8", "fd00::/8"})
	for _, c := range []struct {
		rules            Rules
		network, address string
		ok               bool
	}{
		{Rules{}, "tcp4", "10.0.0.5:8001", true},
		{Rules{}, "tcp", "[2001:db8::1]:443", true},
		{Rules{}, "tcp4", "127.0.0.1:8001", true},
		{Rules{}, "tcp6", "[::1]:8001", true},
		{Rules{}, "tcp4", "169.254.169.254:80", false},
		{Rules{}, "tcp6", "[fe80::1]:80", false},
		{Rules{}, "tcp6", "[fe80::1%eth0]:80", false},
		{Rules{}, "tcp6", "[::ffff:169.254.169.254]:80", false},
		{Rules{}, "tcp4", "0.0.0.0:8001", false},
		{Rules{}, "tcp6", "[::]:8001", false},
		{Rules{}, "tcp4", "10.0.0.5:0", false},
		{Rules{}, "tcp4", "engine.internal:80", false}, // a dialer passes IPs, never names
		{Rules{}, "tcp4", "10.0.0.5", false},
		{Rules{}, "udp4", "10.0.0.5:53", false},
		{Rules{}, "unix", "/tmp/x.sock", false},
		{Rules{RefuseLoopback: true}, "tcp4", "127.0.0.1:2379", false},
		{Rules{RefuseLoopback: true}, "tcp6", "[::1]:9090", false},
		{Rules{RefuseLoopback: true}, "tcp4", "10.0.0.5:8001", true},
		{Rules{CIDRs: cidrs}, "tcp4", "10.9.9.9:80", true},
		{Rules{CIDRs: cidrs}, "tcp4", "127.0.0.1:80", true},
		{Rules{CIDRs: cidrs}, "tcp4", "192.168.1.1:80", false},
		{Rules{CIDRs: cidrs}, "tcp6", "[fd00::1]:80", true},
		{Rules{CIDRs: cidrs}, "tcp6", "[2001:db8::1]:80", false},
		{Rules{CIDRs: cidrs, RefuseLoopback: true}, "tcp4", "127.0.0.1:80", false},
	} {
		err := c.rules.Control(c.network, c.address, nil)
		if (err == nil) != c.ok {
			t.Errorf("%+v Control(%s, %q) = %v, want ok=%v", c.rules, c.network, c.address, err, c.ok)
		}
		if err != nil && !errors.Is(err, ErrRefused) {
			t.Errorf("Control(%s, %q) = %v, does not wrap ErrRefused", c.network, c.address, err)
		}
	}
}

// TestControlRefusesTheDial: a net.Dialer with Control never connects to a refused address,
// and its error is a dial *net.OpError wrapping ErrRefused — how the gateway tells "never
// made" (failover, no retry slot) and "refused" (unreachable) from other failures.
func TestControlRefusesTheDial(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := lis.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	d := &net.Dialer{Control: Rules{RefuseLoopback: true}.Control}
	_, err = d.Dial("tcp", lis.Addr().String())
	var op *net.OpError
	if !errors.Is(err, ErrRefused) || !errors.As(err, &op) || op.Op != "dial" {
		t.Fatalf("dial a loopback engine off loopback: %v (%T)", err, err)
	}
	c, err := (&net.Dialer{Control: Rules{}.Control}).Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatalf("dial a loopback engine on loopback: %v", err)
	}
	c.Close()
	<-accepted // the one connection that reached the listener is the allowed one
	select {
	case <-accepted:
		t.Fatal("the refused dial reached the listener")
	default:
	}
}

// FuzzControl: whatever a dialer passes, Control never lets through a connection HostPort
// would refuse as written: an accepted address is a plain IP and port 1–65535 that is neither
// link-local, unspecified nor (with RefuseLoopback) loopback, and lies in engine_cidrs.
func FuzzControl(f *testing.F) {
	for _, s := range []string{"10.0.0.5:8001", "[::1]:80", "127.0.0.1:2379", "169.254.169.254:80",
		"[fe80::1%lo]:1", "0.0.0.0:1", "[::ffff:10.1.1.1]:8", "10.0.0.5:0", "a.b:1", "10.0.0.5:080"} {
		f.Add("tcp", s, false)
		f.Add("tcp4", s, true)
	}
	cidrs, _ := ParseCIDRs([]string{"10.0.0.0/8", "127.0.0.0/8", "fd00::/8"})
	f.Fuzz(func(t *testing.T, network, address string, refuseLoopback bool) {
		r := Rules{CIDRs: cidrs, RefuseLoopback: refuseLoopback}
		err := r.Control(network, address, nil)
		if err != nil {
			if !errors.Is(err, ErrRefused) {
				t.Fatalf("Control(%q, %q) = %v, not ErrRefused", network, address, err)
			}
			return
		}
		if err := r.HostPort(address); err != nil {
			t.Fatalf("Control accepted %q, which HostPort refuses: %v", address, err)
		}
		ap, err := netip.ParseAddrPort(address)
		if err != nil || ap.Port() == 0 {
			t.Fatalf("accepted %q: %v", address, err)
		}
		ip := ap.Addr().Unmap()
		if ip.IsUnspecified() || ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.Zone() != "" ||
			(refuseLoopback && ip.IsLoopback()) || !(cidrs[0].Contains(ip) || cidrs[1].Contains(ip) || cidrs[2].Contains(ip)) {
			t.Fatalf("accepted %q (loopback refused: %v)", address, refuseLoopback)
		}
	})
}
