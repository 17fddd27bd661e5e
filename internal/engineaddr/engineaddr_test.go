package engineaddr

import (
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
