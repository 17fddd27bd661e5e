package engine

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
)

// startHeartbeats sends WorkerStatus to every gateway now and then every T, each on its own
// goroutine and connection so one unreachable gateway never delays another. The interval
// follows the latest ack's heartbeat_interval_ms; an ack with drain makes the engine report
// draining from then on.
func (e *Engine) startHeartbeats() {
	for _, addr := range e.cfg.Gateways {
		e.wg.Add(1)
		go func(addr string) {
			defer e.wg.Done()
			e.heartbeatLoop(addr)
		}(addr)
	}
}

// RegistryAuth is what an engine presents to a registry (R13.1): a bearer token, and TLS
// (the CA that signed the registry's certificate; a client certificate and key for mTLS).
// The zero value heartbeats in plaintext without a token.
type RegistryAuth struct {
	Token                  string
	TLSCA, TLSCert, TLSKey string
}

// Check reads the TLS files, so a bad one fails at start-up rather than in the heartbeat loop.
func (a RegistryAuth) Check() error {
	_, err := a.dialOptions()
	return err
}

// dialOptions builds the heartbeat connection's credentials.
func (a RegistryAuth) dialOptions() ([]grpc.DialOption, error) {
	var opts []grpc.DialOption
	if a.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: a.Token, tls: a.TLSCA != ""}))
	}
	if a.TLSCA == "" {
		if a.TLSCert != "" || a.TLSKey != "" {
			return nil, errors.New("a client certificate needs the registry's CA (--tls-ca)")
		}
		return append(opts, grpc.WithTransportCredentials(insecure.NewCredentials())), nil
	}
	pem, err := os.ReadFile(a.TLSCA)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--tls-ca: %s holds no PEM certificate", a.TLSCA)
	}
	tc := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if a.TLSCert != "" || a.TLSKey != "" {
		cert, err := tls.LoadX509KeyPair(a.TLSCert, a.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return append(opts, grpc.WithTransportCredentials(credentials.NewTLS(tc))), nil
}

// bearer sends `authorization: Bearer <token>` with every call.
type bearer struct {
	token string
	tls   bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity is false so a token also works against a plaintext loopback
// registry; over a network, use TLS.
func (b bearer) RequireTransportSecurity() bool { return b.tls }

func (e *Engine) heartbeatLoop(addr string) {
	opts, err := e.cfg.RegistryAuth.dialOptions()
	if err != nil {
		e.log.Error("heartbeat: registry credentials", "gateway", addr, "err", err)
		return
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		e.log.Error("heartbeat: bad gateway address", "gateway", addr, "err", err)
		return
	}
	defer conn.Close()
	client := controlv1.NewWorkerRegistryClient(conn)
	interval := e.cfg.HeartbeatInterval
	for {
		ctx, cancel := context.WithTimeout(context.Background(), interval)
		ack, err := client.Heartbeat(ctx, e.workerStatus())
		cancel()
		if err != nil {
			e.log.Warn("heartbeat failed", "gateway", addr, "err", err)
		} else {
			if ms := ack.GetHeartbeatIntervalMs(); ms > 0 {
				interval = time.Duration(ms) * time.Millisecond
			}
			if ack.GetDrain() && !e.draining.Swap(true) {
				e.log.Info("gateway asked to drain", "gateway", addr)
			}
		}
		tick := make(chan struct{})
		t := e.cfg.Clock.AfterFunc(interval, func() { close(tick) })
		select {
		case <-tick:
		case <-e.stop:
			t.Stop()
			return
		}
	}
}

var roles = map[Role]controlv1.Role{
	RoleUnified: controlv1.Role_ROLE_UNIFIED,
	RolePrefill: controlv1.Role_ROLE_PREFILL,
	RoleDecode:  controlv1.Role_ROLE_DECODE,
}

func (e *Engine) workerStatus() *controlv1.WorkerStatus {
	st := e.Status()
	return &controlv1.WorkerStatus{
		WorkerId: e.cfg.ID, HttpAddress: e.advertisedHTTP, GrpcAddress: e.GRPCAddr, KvAddress: e.KVAddr,
		Role: roles[e.cfg.Role], Model: e.cfg.Model, KvFormat: kvFormat,
		QueueDepth: int32(st.QueueDepth), Running: int32(st.Running),
		KvFreeBlocks: int32(st.KVFreeBlocks), KvTotalBlocks: int32(st.KVTotalBlocks),
		// The KV pool's tokens per block (--block-size): capacity = kv_total_blocks × block_size.
		BlockSize: uint32(e.cfg.BlockSize),
		Draining:  st.Draining,
	}
}
