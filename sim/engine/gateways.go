package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Bounds on a dns:/// gateway entry (SPEC R16).
const (
	// MaxGatewaysPerName is how many of a name's addresses get a heartbeat loop; the rest of a
	// larger answer (sorted) is dropped with a warning.
	MaxGatewaysPerName = 64
	// maxDNSName and maxDNSLabel are RFC 1035's limits on a name (without its final dot).
	maxDNSName  = 253
	maxDNSLabel = 63
	// lookupTimeout bounds one resolution, so a dead DNS server delays the next one at most this.
	lookupTimeout = 10 * time.Second
	dnsScheme     = "dns:///"
)

// Resolver answers a name's A and AAAA records; *net.Resolver is one (network "ip").
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

var _ Resolver = (*net.Resolver)(nil)

// gatewayEntry is one --gateway entry: a fixed address, or a name to resolve to every replica.
type gatewayEntry struct {
	addr       string // host:port as given, when name is empty
	name, port string // a dns:///name:port entry
}

// ParseGatewayList splits --gateway on commas, drops empty entries and checks each: either
// host:port (dialled as given) or dns:///name:port (every A/AAAA record of name, re-resolved).
// Any other scheme, a dns entry with an authority (dns://8.8.8.8/…) or without a numeric port
// is an error naming the entry. Example: "gw-0:9090, dns:///tlgw-registry.ns.svc:9090".
func ParseGatewayList(list string) ([]string, error) {
	var out []string
	for _, g := range strings.Split(list, ",") {
		if g = strings.TrimSpace(g); g == "" {
			continue
		}
		if _, err := parseGateway(g); err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

// parseGateways parses Config.Gateways; an entry given twice counts once.
func parseGateways(gws []string) ([]gatewayEntry, error) {
	out := make([]gatewayEntry, 0, len(gws))
	for _, g := range gws {
		ge, err := parseGateway(g)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(out, ge) {
			out = append(out, ge)
		}
	}
	return out, nil
}

// parseGateway parses one entry; the error names it and says what is wanted.
func parseGateway(s string) (gatewayEntry, error) {
	if rest, ok := strings.CutPrefix(s, dnsScheme); ok {
		name, port, err := splitHostPort(rest)
		if err == nil {
			err = checkDNSName(name)
		}
		if err != nil {
			return gatewayEntry{}, fmt.Errorf("--gateway %q: %w (want dns:///name:port)", s, err)
		}
		return gatewayEntry{name: name, port: port}, nil
	}
	if strings.Contains(s, ":/") || strings.HasPrefix(s, "dns:") {
		return gatewayEntry{}, fmt.Errorf("--gateway %q: the only scheme is dns:///name:port (or give host:port)", s)
	}
	if _, _, err := splitHostPort(s); err != nil {
		return gatewayEntry{}, fmt.Errorf("--gateway %q: %w (want host:port or dns:///name:port)", s, err)
	}
	return gatewayEntry{addr: s}, nil
}

// splitHostPort is net.SplitHostPort with a port of 1 to 65535 required.
func splitHostPort(s string) (host, port string, err error) {
	host, port, err = net.SplitHostPort(s)
	if err != nil {
		return "", "", err
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return "", "", fmt.Errorf("port %q is not 1 to 65535", port)
	}
	return host, port, nil
}

// checkDNSName accepts an IP literal or a name of at most 253 characters (a final dot aside)
// whose labels are 1 to 63 letters, digits, hyphens or underscores.
func checkDNSName(name string) error {
	if _, err := netip.ParseAddr(name); err == nil {
		return nil
	}
	trimmed := strings.TrimSuffix(name, ".")
	if trimmed == "" {
		return errors.New("no name")
	}
	if len(trimmed) > maxDNSName {
		return fmt.Errorf("name is %d characters, over %d", len(trimmed), maxDNSName)
	}
	for _, label := range strings.Split(trimmed, ".") {
		if len(label) == 0 || len(label) > maxDNSLabel {
			return fmt.Errorf("label %q is not 1 to %d characters", label, maxDNSLabel)
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return fmt.Errorf("label %q holds %q", label, r)
			}
		}
	}
	return nil
}

// resolve looks ge's name up and returns its heartbeat targets; an error or an empty answer
// leaves the caller's current set alone.
func (e *Engine) resolve(ctx context.Context, ge gatewayEntry) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	ips, err := e.cfg.Resolver.LookupNetIP(ctx, "ip", ge.name)
	if err != nil {
		return nil, err
	}
	targets, dropped := gatewayTargets(ips, ge.port)
	if len(targets) == 0 {
		return nil, errors.New("no addresses")
	}
	if dropped > 0 {
		e.log.Warn("heartbeat: gateway name has too many addresses", "name", ge.name,
			"kept", len(targets), "dropped", dropped)
	}
	return targets, nil
}

// gatewayTargets turns a lookup's answer into ip:port targets: IPv4-mapped addresses unmapped,
// duplicates dropped, sorted, at most MaxGatewaysPerName kept (dropped counts the rest).
// Example: [::1, 10.0.0.2, ::ffff:10.0.0.1, 10.0.0.2] with port 9090 gives
// [10.0.0.1:9090 10.0.0.2:9090 [::1]:9090].
func gatewayTargets(ips []netip.Addr, port string) (targets []string, dropped int) {
	addrs := make([]netip.Addr, 0, len(ips))
	for _, ip := range ips {
		if ip.IsValid() {
			addrs = append(addrs, ip.Unmap())
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	if len(addrs) > MaxGatewaysPerName {
		dropped = len(addrs) - MaxGatewaysPerName
		addrs = addrs[:MaxGatewaysPerName]
	}
	for _, a := range addrs {
		targets = append(targets, net.JoinHostPort(a.String(), port))
	}
	return targets, dropped
}
