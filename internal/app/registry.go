package app

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	grpcapi "github.com/tlgw/tlgw/adapters/grpc"
	"github.com/tlgw/tlgw/internal/config"
)

// registryOptions turns [registry] into the WorkerRegistry's options and the gRPC server's
// TLS (R13.1, R13.2). It applies the exposure rule again (config.Parse did, a Config built in
// code may not have) and reads the TLS files, naming the key of any that fails.
func registryOptions(cfg *config.Config) (grpcapi.Options, []grpc.ServerOption, error) {
	r := cfg.Registry
	if err := config.RegistryExposure(cfg); err != nil {
		return grpcapi.Options{}, nil, fmt.Errorf("config: registry.allow_insecure: %w", err)
	}
	tokens := make([]grpcapi.Token, 0, len(r.Tokens))
	for _, t := range r.Tokens {
		tokens = append(tokens, grpcapi.Token{Secret: t.Token, Models: t.Models, IDPrefix: t.IDPrefix, MaxWorkers: t.MaxWorkers})
	}
	o := grpcapi.Options{
		Auth:                  grpcapi.NewAuth(tokens, r.ClientCA != "").WithCertificateQuota(r.CertificateMaxWorkers),
		Addresses:             cfg.EngineRules(),
		MaxConnections:        grpcapi.ConnectionLimit(r.MaxWorkers),
		MaxCalls:              grpcapi.CallLimit(r.MaxWorkers),
		MaxProbeCalls:         grpcapi.ProbeLimit,
		MaxCallsPerPeer:       r.MaxCallsPerPeer,
		MaxConnectionsPerPeer: r.MaxConnectionsPerPeer,
	}
	if r.TLSCert == "" && r.TLSKey == "" {
		if r.ClientCA != "" {
			return grpcapi.Options{}, nil, fmt.Errorf("config: registry.client_ca: needs tls_cert and tls_key")
		}
		return o, nil, nil
	}
	cert, err := tls.LoadX509KeyPair(r.TLSCert, r.TLSKey)
	if err != nil {
		return grpcapi.Options{}, nil, fmt.Errorf("config: registry.tls_cert: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if r.ClientCA != "" {
		pem, err := os.ReadFile(r.ClientCA)
		if err != nil {
			return grpcapi.Options{}, nil, fmt.Errorf("config: registry.client_ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return grpcapi.Options{}, nil, fmt.Errorf("config: registry.client_ca: %s holds no PEM certificate", r.ClientCA)
		}
		tc.ClientCAs, tc.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return o, []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc))}, nil
}
