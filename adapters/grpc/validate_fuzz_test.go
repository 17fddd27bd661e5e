package grpcapi_test

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	grpcapi "github.com/tlgw/tlgw/adapters/grpc"
	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/engineaddr"
)

// FuzzValidateWorkerStatus: whatever a heartbeat carries, an accepted one has an id and a
// model of 1–256 bytes, and every address it carries is a plain host:port whose IP (if any)
// is neither link-local nor unspecified and lies in engine_cidrs.
func FuzzValidateWorkerStatus(f *testing.F) {
	f.Add("w1", "smol", "127.0.0.1:8001", "127.0.0.1:9001", "", int32(0), int32(1))
	f.Add("w1", "smol", "169.254.169.254/latest?x=", "", "", int32(0), int32(0))
	f.Add("w1", "smol", "[fe80::1]:80", "unix:/x", "10.0.0.1:1", int32(-1), int32(2))
	f.Add(strings.Repeat("i", 300), "m", "engine.internal:80", "", "", int32(5), int32(3))
	cidrs, _ := engineaddr.ParseCIDRs([]string{"127.0.0.0/8", "10.0.0.0/8", "fd00::/8"})
	rules := engineaddr.Rules{CIDRs: cidrs}
	f.Fuzz(func(t *testing.T, id, model, httpAddr, grpcAddr, kvAddr string, queue, role int32) {
		st := &controlv1.WorkerStatus{
			WorkerId: id, Model: model, HttpAddress: httpAddr, GrpcAddress: grpcAddr, KvAddress: kvAddr,
			QueueDepth: queue, Role: controlv1.Role(role),
		}
		info, err := grpcapi.ValidateWorkerStatus(st, rules)
		if err != nil {
			return
		}
		if info.ID != id || info.ID == "" || len(id) > 256 || model == "" || len(model) > 256 || queue < 0 {
			t.Fatalf("accepted %+v", st)
		}
		for _, a := range []string{httpAddr, grpcAddr, kvAddr} {
			if a == "" && a != httpAddr {
				continue
			}
			host, port, err := net.SplitHostPort(a)
			if err != nil || host == "" || port == "" || strings.ContainsAny(a, "/?#@ ") ||
				strings.HasPrefix(strings.ToLower(a), "unix:") || strings.HasPrefix(strings.ToLower(a), "unix-abstract:") {
				t.Fatalf("accepted address %q", a)
			}
			if ip, err := netip.ParseAddr(host); err == nil {
				ip = ip.Unmap()
				if ip.IsLinkLocalUnicast() || ip.IsUnspecified() || !inAny(cidrs, ip) {
					t.Fatalf("accepted address %q", a)
				}
			}
		}
	})
}

func inAny(ps []netip.Prefix, ip netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
