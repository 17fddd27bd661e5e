package app

import (
	"fmt"
	"net"
)

// advertiseAddress is the registry address this replica publishes under replicas/ for the other
// replicas to dial (load sharing, R23): the configured one when set; else the listener's own
// address when it names a host; else (a wildcard listener, as in a pod) this host's first global
// unicast address at the listener's port, IPv4 before IPv6, and loopback when it has none (one
// machine). addrs is net.InterfaceAddrs, injectable for tests.
func advertiseAddress(configured, listen string, addrs func() ([]net.Addr, error)) (string, error) {
	if configured != "" {
		return configured, nil
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("registry address %q: %w", listen, err)
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return listen, nil
	}
	as, err := addrs()
	if err != nil {
		return "", fmt.Errorf("this host's addresses (set [cluster] advertise_address): %w", err)
	}
	var v6 net.IP
	for _, a := range as {
		n, ok := a.(*net.IPNet)
		if !ok || !n.IP.IsGlobalUnicast() {
			continue
		}
		if v4 := n.IP.To4(); v4 != nil {
			return net.JoinHostPort(v4.String(), port), nil
		}
		if v6 == nil {
			v6 = n.IP
		}
	}
	if v6 != nil {
		return net.JoinHostPort(v6.String(), port), nil
	}
	return net.JoinHostPort("127.0.0.1", port), nil
}
