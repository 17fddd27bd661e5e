package app_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
	"github.com/tlgw/tlgw/internal/app"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/sim/engine"
)

// pki is a throwaway CA with a server certificate for 127.0.0.1 and client certificates,
// written as PEM files under a temporary directory.
type pki struct {
	t      *testing.T
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{t: t, dir: t.TempDir()}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tlgw test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	p.ca, _ = x509.ParseCertificate(der)
	p.caKey, p.serial = key, 1
	p.write("ca.pem", "CERTIFICATE", der)
	return p
}

func (p *pki) write(name, typ string, der []byte) string {
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		p.t.Fatal(err)
	}
	return path
}

// issue makes a leaf certificate; it returns the cert and key file paths.
func (p *pki) issue(name, cn string, usage x509.ExtKeyUsage, ips ...net.IP) (string, string) {
	p.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		p.t.Fatal(err)
	}
	p.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		p.t.Fatal(err)
	}
	kd, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		p.t.Fatal(err)
	}
	return p.write(name+".pem", "CERTIFICATE", der), p.write(name+"-key.pem", "PRIVATE KEY", kd)
}

// heartbeat sends one heartbeat of id to addr over TLS with the client certificate in
// certFile and keyFile, trusting p's CA, with token as bearer ("" = none).
func (p *pki) heartbeat(t *testing.T, addr, certFile, keyFile, token, id string) error {
	t.Helper()
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(
		&tls.Config{RootCAs: pool, Certificates: []tls.Certificate{c}})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	_, err = controlv1.NewWorkerRegistryClient(conn).Heartbeat(ctx, heartbeatStatus(id))
	return err
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func heartbeatStatus(id string) *controlv1.WorkerStatus {
	return &controlv1.WorkerStatus{WorkerId: id, Model: "smol", HttpAddress: "127.0.0.1:9", Role: controlv1.Role_ROLE_UNIFIED}
}

// TestRegistryMTLS (R13.1): with client_ca, a tlengine with a client certificate registers;
// a client without one, or in plaintext, does not; another certificate cannot take over the
// engine's live id.
func TestRegistryMTLS(t *testing.T) {
	p := newPKI(t)
	srvCert, srvKey := p.issue("server", "tlgw", x509.ExtKeyUsageServerAuth, net.ParseIP("127.0.0.1"))
	aCert, aKey := p.issue("engine-a", "engine-a", x509.ExtKeyUsageClientAuth)
	bCert, bKey := p.issue("engine-b", "engine-b", x509.ExtKeyUsageClientAuth)
	caFile := filepath.Join(p.dir, "ca.pem")

	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Registry.TLSCert, cfg.Registry.TLSKey, cfg.Registry.ClientCA = srvCert, srvKey, caFile
	a, err := app.Start(cfg, app.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Shutdown(context.Background()) })

	e, err := engine.Start(engine.Config{
		ID: "e1", Model: "smol", Gateways: []string{a.GRPCAddr}, Logger: quiet(),
		RegistryAuth: engine.RegistryAuth{TLSCA: caFile, TLSCert: aCert, TLSKey: aKey},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	gwtest.Eventually(t, "e1 registered over mTLS", func() bool { n, _ := a.Gateway.Routable(); return n == 1 })

	call := func(opts ...grpc.DialOption) error {
		conn, err := grpc.NewClient(a.GRPCAddr, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = controlv1.NewWorkerRegistryClient(conn).Heartbeat(ctx, heartbeatStatus("e1"))
		return err
	}
	pool := x509.NewCertPool()
	pool.AddCert(p.ca)
	withCert := func(certFile, keyFile string) grpc.DialOption {
		tc := &tls.Config{RootCAs: pool}
		if certFile != "" {
			c, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				t.Fatal(err)
			}
			tc.Certificates = []tls.Certificate{c}
		}
		return grpc.WithTransportCredentials(credentials.NewTLS(tc))
	}
	if err := call(withCert("", "")); err == nil {
		t.Fatal("a client without a certificate was served")
	}
	if err := call(grpc.WithTransportCredentials(insecure.NewCredentials())); err == nil {
		t.Fatal("a plaintext client was served")
	}
	if err := call(withCert(bCert, bKey)); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("engine-b taking over e1: %v, want PermissionDenied", err)
	}
	if err := call(withCert(aCert, aKey)); err != nil {
		t.Fatalf("engine-a's own id: %v", err)
	}
	list, err := a.Gateway.Workers()
	if err != nil || len(list.Workers) != 1 {
		t.Fatalf("workers %v %v", list, err)
	}
}

// TestRegistryTokenEngine (R13.1): a tlengine with the right --token registers; a heartbeat
// without one is Unauthenticated.
func TestRegistryTokenEngine(t *testing.T) {
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Registry.Tokens = []config.RegistryToken{{Token: "engine-token", Models: []string{"smol"}, IDPrefix: "e"}}
	a, err := app.Start(cfg, app.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Shutdown(context.Background()) })
	e, err := engine.Start(engine.Config{
		ID: "e1", Model: "smol", Gateways: []string{a.GRPCAddr}, Logger: quiet(),
		RegistryAuth: engine.RegistryAuth{Token: "engine-token"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	gwtest.Eventually(t, "e1 registered with its token", func() bool { n, _ := a.Gateway.Routable(); return n == 1 })

	conn, err := grpc.NewClient(a.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := controlv1.NewWorkerRegistryClient(conn)
	_, err = c.Heartbeat(context.Background(), heartbeatStatus("e2"))
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v, want Unauthenticated", err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer engine-token")
	st := heartbeatStatus("e2")
	st.Model = "big"
	if _, err := c.Heartbeat(ctx, st); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("model outside the grant: %v, want PermissionDenied", err)
	}
}

// TestRegistryExposureAtStart (R13.1): an open registry outside loopback does not start
// unless allow_insecure; a TLS file that cannot be read names its key.
func TestRegistryExposureAtStart(t *testing.T) {
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "0.0.0.0:0"
	if _, err := app.Start(cfg, app.Options{Logger: quiet()}); err == nil || !strings.Contains(err.Error(), "registry.allow_insecure") {
		t.Fatalf("open registry on 0.0.0.0: %v", err)
	}
	cfg.Gateway.RegistryListen = "127.0.0.1:0"
	cfg.Registry.TLSCert, cfg.Registry.TLSKey = filepath.Join(t.TempDir(), "nope.pem"), "nope-key.pem"
	if _, err := app.Start(cfg, app.Options{Logger: quiet()}); err == nil || !strings.Contains(err.Error(), "registry.tls_cert") {
		t.Fatalf("missing tls_cert: %v", err)
	}
}

// TestRegistryTokenAndMTLS: with both tokens and client_ca an engine needs both; the
// credential is the pair, so the same token with another certificate cannot take over a
// live id.
func TestRegistryTokenAndMTLS(t *testing.T) {
	p := newPKI(t)
	srvCert, srvKey := p.issue("server", "tlgw", x509.ExtKeyUsageServerAuth, net.ParseIP("127.0.0.1"))
	aCert, aKey := p.issue("engine-a", "engine-a", x509.ExtKeyUsageClientAuth)
	bCert, bKey := p.issue("engine-b", "engine-b", x509.ExtKeyUsageClientAuth)
	caFile := filepath.Join(p.dir, "ca.pem")

	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Registry.TLSCert, cfg.Registry.TLSKey, cfg.Registry.ClientCA = srvCert, srvKey, caFile
	cfg.Registry.Tokens = []config.RegistryToken{{Token: "shared"}}
	a, err := app.Start(cfg, app.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Shutdown(context.Background()) })

	call := func(certFile, keyFile, token string) error {
		return p.heartbeat(t, a.GRPCAddr, certFile, keyFile, token, "e1")
	}
	if err := call(aCert, aKey, ""); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("certificate without token: %v, want Unauthenticated", err)
	}
	if err := call(aCert, aKey, "shared"); err != nil {
		t.Fatalf("certificate and token: %v", err)
	}
	if err := call(bCert, bKey, "shared"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("same token, other certificate: %v, want PermissionDenied", err)
	}
}

// TestShutdownWithRegistryStreams: peers holding streams open on the registry (a health Watch,
// a reflection stream) do not hold the gateway's shutdown past its grace period.
func TestShutdownWithRegistryStreams(t *testing.T) {
	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	a, err := app.Start(cfg, app.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(a.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w, err := healthpb.NewHealthClient(conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	rs, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err == nil {
		err = rs.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}})
	}
	if err == nil {
		_, err = rs.Recv()
	}
	if err != nil {
		t.Fatalf("reflection: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.Shutdown(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("shutdown has not returned 10 s after a 200 ms grace period")
	}
}

// TestRegistryQuotas (R20, issue 35: one token could take every max_workers slot, and every
// other pool's restarting engines were refused): [registry] tokens[].max_workers caps the
// workers registered with a token and certificate_max_workers those of one client-certificate
// identity; a new id beyond either is ResourceExhausted while other credentials still
// register.
func TestRegistryQuotas(t *testing.T) {
	p := newPKI(t)
	srvCert, srvKey := p.issue("server", "tlgw", x509.ExtKeyUsageServerAuth, net.ParseIP("127.0.0.1"))
	aCert, aKey := p.issue("engine-a", "engine-a", x509.ExtKeyUsageClientAuth)
	bCert, bKey := p.issue("engine-b", "engine-b", x509.ExtKeyUsageClientAuth)
	caFile := filepath.Join(p.dir, "ca.pem")

	cfg := config.Default()
	cfg.Gateway.HTTPListen, cfg.Gateway.RegistryListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Registry.TLSCert, cfg.Registry.TLSKey, cfg.Registry.ClientCA = srvCert, srvKey, caFile
	cfg.Registry.Tokens = []config.RegistryToken{{Token: "pool-a", MaxWorkers: 3}, {Token: "pool-b"}}
	cfg.Registry.CertificateMaxWorkers = 2
	a, err := app.Start(cfg, app.Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Shutdown(context.Background()) })

	call := func(certFile, keyFile, token, id string) error {
		return p.heartbeat(t, a.GRPCAddr, certFile, keyFile, token, id)
	}
	for _, c := range []struct {
		cert, key, token, id string
		want                 codes.Code
	}{
		{aCert, aKey, "pool-a", "a1", codes.OK},
		{aCert, aKey, "pool-a", "a2", codes.OK},
		{aCert, aKey, "pool-a", "a3", codes.ResourceExhausted}, // engine-a's certificate: 2
		{aCert, aKey, "pool-a", "a2", codes.OK},                // a registered id at the quota
		{bCert, bKey, "pool-a", "b1", codes.OK},
		{bCert, bKey, "pool-a", "b2", codes.ResourceExhausted}, // pool-a's token: 3
		{bCert, bKey, "pool-b", "c1", codes.OK},
		{bCert, bKey, "pool-b", "c2", codes.ResourceExhausted}, // engine-b's certificate: 2
	} {
		if err := call(c.cert, c.key, c.token, c.id); status.Code(err) != c.want {
			t.Fatalf("%s with %s: %v, want %v", c.id, c.token, err, c.want)
		}
	}
	list, err := a.Gateway.Workers()
	if err != nil || len(list.Workers) != 4 {
		t.Fatalf("workers %+v %v, want a1, a2, b1, c1", list, err)
	}
}
