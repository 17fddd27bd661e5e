package engine

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	controlv1 "github.com/tlgw/tlgw/contracts/tl/control/v1"
)

// startHeartbeats runs the supervisor of the heartbeat loops (superviseHeartbeats); Close
// waits for it, and it waits for every loop.
func (e *Engine) startHeartbeats() {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.superviseHeartbeats()
	}()
}

// superviseHeartbeats keeps one heartbeat loop per gateway address (SPEC R16): a host:port
// entry as given; a dns:///name:port entry resolved to every A/AAAA record now and then every
// ResolveInterval on the clock. A new address gets a loop at once; a vanished one has its loop
// stopped and its connection closed; an address named twice is heartbeated once; a failed
// lookup keeps that name's last answer. When the engine closes, every loop has ended before
// this returns.
func (e *Engine) superviseHeartbeats() {
	defer e.setHeartbeatTargets(nil)
	resolved := make(map[gatewayEntry][]string)
	names := slices.ContainsFunc(e.gateways, func(ge gatewayEntry) bool { return ge.name != "" })
	for {
		e.resolveNames(resolved)
		e.setHeartbeatTargets(wantedTargets(e.gateways, resolved))
		if !names {
			<-e.stop
			return
		}
		if e.sleep(e.stopCtx, e.cfg.ResolveInterval) != nil {
			return
		}
	}
}

// resolveNames looks every dns entry up and records its answer in resolved; a failed lookup
// leaves the entry's last answer there (none before the first success).
func (e *Engine) resolveNames(resolved map[gatewayEntry][]string) {
	for _, ge := range e.gateways {
		if ge.name == "" {
			continue
		}
		targets, err := e.resolve(e.stopCtx, ge)
		if err != nil {
			if e.stopCtx.Err() == nil {
				e.log.Warn("heartbeat: gateway lookup failed; keeping its addresses", "name", ge.name,
					"kept", len(resolved[ge]), "err", err)
			}
			continue
		}
		resolved[ge] = targets
	}
}

// wantedTargets lists the addresses to heartbeat, in entry order, each once: a fixed entry's
// address, a dns entry's last answer.
func wantedTargets(entries []gatewayEntry, resolved map[gatewayEntry][]string) []string {
	var out []string
	seen := make(map[string]bool)
	add := func(addr string) {
		if !seen[addr] {
			seen[addr] = true
			out = append(out, addr)
		}
	}
	for _, ge := range entries {
		if ge.name == "" {
			add(ge.addr)
			continue
		}
		for _, addr := range resolved[ge] {
			add(addr)
		}
	}
	return out
}

// heartbeatLoops is the running loops by address. Only the supervisor changes it; a reader
// (heartbeatTargets) may wait out a stop, as the loops themselves never take the mutex.
type heartbeatLoops struct {
	mu    sync.Mutex
	loops map[string]*runningLoop
}

// runningLoop is one heartbeat loop: cancel ends it, done closes once its connection is closed.
type runningLoop struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// setHeartbeatTargets makes the running loops exactly want's: it stops the loops of addresses
// not in want and waits until they have ended, then starts one for each new address.
func (e *Engine) setHeartbeatTargets(want []string) {
	e.hb.mu.Lock()
	defer e.hb.mu.Unlock()
	keep := make(map[string]bool, len(want))
	for _, addr := range want {
		keep[addr] = true
	}
	var gone []string
	for addr, l := range e.hb.loops {
		if !keep[addr] {
			l.cancel() // all at once, then wait for each
			gone = append(gone, addr)
		}
	}
	for _, addr := range gone {
		<-e.hb.loops[addr].done
		delete(e.hb.loops, addr)
	}
	var added []string
	for _, addr := range want {
		if _, ok := e.hb.loops[addr]; !ok {
			e.hb.loops[addr] = e.startLoop(addr)
			added = append(added, addr)
		}
	}
	if want != nil && len(added)+len(gone) > 0 {
		slices.Sort(gone)
		e.log.Info("heartbeat gateways changed", "added", added, "removed", gone)
	}
}

// startLoop starts addr's heartbeat loop on its own goroutine.
func (e *Engine) startLoop(addr string) *runningLoop {
	ctx, cancel := context.WithCancel(e.stopCtx)
	l := &runningLoop{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		e.heartbeatLoop(ctx, addr)
	}()
	return l
}

// heartbeatTargets is the addresses with a running loop, sorted.
func (e *Engine) heartbeatTargets() []string {
	e.hb.mu.Lock()
	defer e.hb.mu.Unlock()
	return slices.Sorted(maps.Keys(e.hb.loops))
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

// heartbeatLoop sends WorkerStatus to addr now and then every T on its own connection, so one
// unreachable gateway never delays another, until ctx ends. T follows the latest ack's
// heartbeat_interval_ms. The engine reports draining while the latest ack of any gateway asks
// it to drain: an operator's undrain (the next ack without drain) lifts it, and a gateway whose
// loop stops no longer holds it.
func (e *Engine) heartbeatLoop(ctx context.Context, addr string) {
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
	told := false // this gateway's latest ack asks for a drain
	defer func() {
		if told {
			e.drainAcks.Add(-1)
		}
	}()
	for {
		rpcCtx, cancel := context.WithTimeout(ctx, interval)
		ack, err := client.Heartbeat(rpcCtx, e.workerStatus())
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			e.log.Warn("heartbeat failed", "gateway", addr, "err", err)
		default:
			if ms := ack.GetHeartbeatIntervalMs(); ms > 0 {
				interval = time.Duration(ms) * time.Millisecond
			}
			if d := ack.GetDrain(); d != told {
				told = d
				if d {
					e.drainAcks.Add(1)
					e.log.Info("gateway asked to drain", "gateway", addr)
				} else {
					e.drainAcks.Add(-1)
					e.log.Info("gateway lifted the drain", "gateway", addr)
				}
			}
		}
		if e.sleep(ctx, interval) != nil {
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
		// KvEvents/Subscribe on GrpcAddress (R18.3), unless the engine publishes vLLM-format
		// events (--kv-events): then it is seen as a vLLM engine is, with no tl.kv stream (its
		// blocks would be indexed twice, by chunk id and by block key).
		KvEvents: e.zpub == nil,
		// R21: the adapters served besides the base model, the GPU slots for them, the serving
		// endpoints.
		LoraAdapters: e.loras.names(),
		MaxLoras:     uint32(e.cfg.MaxLoRAs),
		Endpoints:    e.cfg.Endpoints,
		// R22: the bound vLLM-format KV event PUB (and replay ROUTER); "" when connecting.
		KvEventsEndpoint: e.KVEventsEndpoint(),
	}
}
