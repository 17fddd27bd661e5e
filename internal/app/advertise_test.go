package app

import (
	"errors"
	"net"
	"testing"
)

func TestAdvertiseAddress(t *testing.T) {
	nets := func(cidrs ...string) func() ([]net.Addr, error) {
		return func() ([]net.Addr, error) {
			var out []net.Addr
			for _, c := range cidrs {
				ip, n, err := net.ParseCIDR(c)
				if err != nil {
					t.Fatal(err)
				}
				n.IP = ip
				out = append(out, n)
			}
			out = append(out, &net.UnixAddr{Name: "/x"}) // not an IP network: skipped
			return out, nil
		}
	}
	pod := nets("127.0.0.1/8", "::1/128", "fe80::1/64", "fd00::7/64", "10.1.2.3/24")
	for _, c := range []struct {
		configured, listen string
		addrs              func() ([]net.Addr, error)
		want               string
	}{
		{"gw-0.tlgw:9090", "0.0.0.0:9090", pod, "gw-0.tlgw:9090"},
		{"", "127.0.0.1:9090", pod, "127.0.0.1:9090"},
		{"", "10.9.9.9:9090", pod, "10.9.9.9:9090"},
		{"", "gw.local:9090", pod, "gw.local:9090"},
		{"", "0.0.0.0:9090", pod, "10.1.2.3:9090"},
		{"", "[::]:9090", pod, "10.1.2.3:9090"},
		{"", ":9090", pod, "10.1.2.3:9090"},
		{"", ":9090", nets("127.0.0.1/8", "fe80::1/64", "2001:db8::5/64"), "[2001:db8::5]:9090"},
		{"", ":9090", nets("127.0.0.1/8"), "127.0.0.1:9090"},
	} {
		got, err := advertiseAddress(c.configured, c.listen, c.addrs)
		if err != nil || got != c.want {
			t.Errorf("advertise(%q, %q) = %q, %v; want %q", c.configured, c.listen, got, err, c.want)
		}
	}
	if _, err := advertiseAddress("", "nonsense", pod); err == nil {
		t.Error("a listener address without a port was taken")
	}
	failing := func() ([]net.Addr, error) { return nil, errors.New("no interfaces") }
	if _, err := advertiseAddress("", ":9090", failing); err == nil {
		t.Error("a failed interface listing was ignored")
	}
}
