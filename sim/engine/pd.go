package engine

// The engines' own disaggregation protocols (SPEC R22, ENGINES.md §2 and §3), as tlengine
// plays them with --pd vllm or --pd sglang:
//
//   - vllm: a request whose kv_transfer_params say do_remote_decode runs its prefill (and one
//     token) on a prefill engine, which then holds the prompt's KV and answers with
//     kv_transfer_params naming it (remote_engine_id, remote_block_ids, remote_host,
//     remote_port, tp_size). A decode engine given those parameters asks the named prefill
//     engine for the KV, which pushes it over KvTransferService as for EngineControl/Prefill
//     (kvtransfer.go), and the decode runs without a prefill of its own.
//   - sglang: a prefill engine given a bootstrap_room runs the prefill and holds its KV under
//     the room; a decode engine given the same room (with bootstrap_host and bootstrap_port,
//     the prefill engine's side channel) asks the prefill engine for it, which waits for the
//     room's prefill (bounded by --pd-timeout), then pushes it.
//
// The decode engine samples every output token itself, from the request's own seed, as a
// unified engine would: its answer equals a unified engine's token for token for one seed.
// The prefill engine frees held KV once it has been pushed, or when --kv-lease passes.
//
// The side channel is a small HTTP server on --bootstrap-port (prefill and unified engines
// with --pd vllm or sglang): POST /tlengine/pd/send asks for held KV to be pushed to the
// caller's KV address.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/propagation"

	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/sim/kv"
	"github.com/tlgw/tlgw/sim/sampler"
)

// The disaggregation protocols of --pd.
const (
	PDTL     = "tl"
	PDVLLM   = "vllm"
	PDSGLang = "sglang"
)

// Bounds of the PD tables and inputs.
const (
	// maxPDHolds bounds the prompts a prefill engine holds for remote decodes at once; a
	// prefill past it answers 503.
	maxPDHolds = 1024
	// maxPDWaits bounds the bootstrap rooms decode engines wait on at once; a wait past it
	// answers 503.
	maxPDWaits = 1024
	// maxHostLen bounds a remote_host or bootstrap_host (a DNS name is at most 253 bytes).
	maxHostLen = 253
	// maxEngineIDLen bounds a remote_engine_id.
	maxEngineIDLen = 256
	// maxSendBody bounds a side-channel request (its block ids are at most one per KV block).
	maxSendBody = 1 << 20
	// maxSendAnswer bounds a side-channel answer the decode engine reads.
	maxSendAnswer = 64 << 10
)

// pdRequest is what a completions or chat body says of disaggregation, for this engine's
// --pd: the prefill half (hold the KV for a remote decode) or the decode half (fetch it).
type pdRequest struct {
	prefill bool // vllm do_remote_decode, or an sglang room on a prefill engine
	decode  bool // vllm do_remote_prefill, or an sglang room on a decode engine
	room    uint64
	// The decode half's source: the prefill engine's side channel and what names the KV.
	host     string
	port     int
	engineID string
	blockIDs []int64
}

// pdWire is the body's disaggregation fields.
type pdWire struct {
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	BootstrapRoom    json.RawMessage `json:"bootstrap_room"`
	BootstrapHost    *string         `json:"bootstrap_host"`
	BootstrapPort    json.RawMessage `json:"bootstrap_port"`
}

// vllmParams is vLLM's kv_transfer_params object, as tlengine writes and reads it.
type vllmParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteBlockIDs  []int64 `json:"remote_block_ids"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	TPSize          *int    `json:"tp_size"`
}

// parsePD reads the body's disaggregation fields as this engine's --pd and role read them;
// nil: the request is an ordinary one (fields of another protocol are ignored, as engines
// ignore fields they do not know).
func (e *Engine) parsePD(body []byte, req *request) (*pdRequest, error) {
	if e.cfg.PD != PDVLLM && e.cfg.PD != PDSGLang {
		return nil, nil
	}
	var w pdWire
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	if e.cfg.PD == PDVLLM {
		return e.parseVLLM(w.KVTransferParams, req)
	}
	return e.parseSGLang(w, req)
}

func (e *Engine) parseVLLM(raw json.RawMessage, req *request) (*pdRequest, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] != '{' {
		return nil, badRequest(`"kv_transfer_params" must be an object`)
	}
	var p vllmParams
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, badRequest(`"kv_transfer_params": %v`, err)
	}
	switch {
	case p.DoRemoteDecode && p.DoRemotePrefill:
		return nil, badRequest(`"kv_transfer_params": do_remote_decode and do_remote_prefill are exclusive`)
	case p.DoRemoteDecode:
		if e.cfg.Role == RoleDecode {
			return nil, badRequest(`"kv_transfer_params": do_remote_decode on a decode engine (it runs no prefill for others)`)
		}
		if req.stream {
			return nil, badRequest(`"kv_transfer_params": a prefill for a remote decode cannot be streamed`)
		}
		return &pdRequest{prefill: true}, nil
	case !p.DoRemotePrefill:
		return nil, nil
	}
	if e.cfg.Role == RolePrefill {
		return nil, badRequest(`"kv_transfer_params": do_remote_prefill on a prefill engine (it decodes nothing)`)
	}
	d := &pdRequest{decode: true, blockIDs: p.RemoteBlockIDs}
	switch {
	case p.RemoteEngineID == nil || *p.RemoteEngineID == "" || len(*p.RemoteEngineID) > maxEngineIDLen:
		return nil, badRequest(`"kv_transfer_params.remote_engine_id" must be a string of 1 to %d bytes`, maxEngineIDLen)
	case len(p.RemoteBlockIDs) == 0 || len(p.RemoteBlockIDs) > e.cfg.KVBlocks:
		return nil, badRequest(`"kv_transfer_params.remote_block_ids" must hold 1 to %d block ids, got %d`, e.cfg.KVBlocks, len(p.RemoteBlockIDs))
	case p.TPSize != nil && *p.TPSize != 1:
		return nil, badRequest(`"kv_transfer_params.tp_size" %d: this engine runs tensor parallel size 1`, *p.TPSize)
	case p.RemotePort == nil:
		return nil, badRequest(`"kv_transfer_params.remote_port" is required`)
	}
	d.engineID = *p.RemoteEngineID
	host := ""
	if p.RemoteHost != nil {
		host = *p.RemoteHost
	}
	var err error
	if d.host, d.port, err = checkHostPort(host, *p.RemotePort, "kv_transfer_params.remote_host", "kv_transfer_params.remote_port"); err != nil {
		return nil, err
	}
	return d, nil
}

func (e *Engine) parseSGLang(w pdWire, req *request) (*pdRequest, error) {
	raw := bytes.TrimSpace(w.BootstrapRoom)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	room, err := strconv.ParseUint(string(raw), 10, 63)
	if err != nil {
		return nil, badRequest(`"bootstrap_room" must be an integer from 0 to 2^63-1`)
	}
	if e.cfg.Role == RoleUnified {
		return nil, nil // both halves here: nothing to transfer
	}
	if e.cfg.Role == RolePrefill {
		return &pdRequest{prefill: true, room: room}, nil
	}
	host := ""
	if w.BootstrapHost != nil {
		host = *w.BootstrapHost
	}
	port := -1
	if p := bytes.TrimSpace(w.BootstrapPort); len(p) > 0 {
		v, err := strconv.Atoi(string(p))
		if err != nil {
			return nil, badRequest(`"bootstrap_port" must be an integer`)
		}
		port = v
	}
	d := &pdRequest{decode: true, room: room}
	if d.host, d.port, err = checkHostPort(host, port, "bootstrap_host", "bootstrap_port"); err != nil {
		return nil, err
	}
	return d, nil
}

// checkHostPort validates a side channel's host (an IP address or a DNS name) and port.
func checkHostPort(host string, port int, hostKey, portKey string) (string, int, error) {
	if port < 1 || port > 65535 {
		return "", 0, badRequest(`%q must be a port from 1 to 65535`, portKey)
	}
	if host == "" || len(host) > maxHostLen {
		return "", 0, badRequest(`%q must be a host of 1 to %d bytes`, hostKey, maxHostLen)
	}
	if net.ParseIP(host) == nil && !dnsName(host) {
		return "", 0, badRequest(`%q %q is neither an IP address nor a DNS name`, hostKey, host)
	}
	return host, port, nil
}

// dnsName reports whether s is a plausible DNS name: labels of letters, digits and hyphens.
func dnsName(s string) bool {
	for _, label := range bytes.Split([]byte(s), []byte(".")) {
		if len(label) == 0 || len(label) > 63 {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// pdHold is a prompt's KV a prefill engine holds for a remote decode: under its block ids
// (vllm) or its bootstrap room (sglang).
type pdHold struct {
	room     uint64
	byRoom   bool
	blockIDs []int64
	seq      *kv.Seq
	lease    clock.Timer
}

// roomWait is the decode engines waiting for one bootstrap room's prefill: ch closes when it
// registers (or when the engine stops: e.stop); n counts the waiters, and the entry goes with
// the last.
type roomWait struct {
	ch chan struct{}
	n  int
}

// pdTable holds the prefill side's KV and the rooms waited on. Bounds: holds at most
// maxPDHolds entries (each leaves when pushed, on its lease, or at Close); waits at most
// maxPDWaits rooms (each leaves with its last waiter, whose wait is bounded by PDTimeout).
// Whoever deletes a hold from its map owns its sequence.
type pdTable struct {
	mu        sync.Mutex
	byBlock   map[int64]*pdHold // vllm: by the first block id
	byRoom    map[uint64]*pdHold
	waits     map[uint64]*roomWait
	nextBlock int64
}

func newPDTable() *pdTable {
	return &pdTable{byBlock: make(map[int64]*pdHold), byRoom: make(map[uint64]*pdHold), waits: make(map[uint64]*roomWait)}
}

func (t *pdTable) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byBlock) + len(t.byRoom)
}

// errPDUnavailable answers a request the PD tables have no room for, or whose KV could not be
// transferred: a transient failure, which a gateway fails over.
func errPDUnavailable(format string, args ...any) *apiError {
	return &apiError{status: 503, typ: "service_unavailable", code: "kv_transfer_failed", msg: fmt.Sprintf(format, args...)}
}

// holdForRemote registers the prompt's KV of a prefill just run (seq, running) for a remote
// decode: a new sequence sharing its blocks (import), leased for KVLease.
func (e *Engine) holdForRemote(x *run, seq *kv.Seq) error {
	held, err := e.sched.importSeq(x.prompt)
	if err != nil {
		return errPDUnavailable("no room to hold the prompt's KV for its decode: %v", err)
	}
	t := e.pdt
	h := &pdHold{seq: held, room: x.pd.room, byRoom: e.cfg.PD == PDSGLang}
	t.mu.Lock()
	switch {
	case len(t.byBlock)+len(t.byRoom) >= maxPDHolds:
		t.mu.Unlock()
		e.sched.freeHeld(held)
		return errPDUnavailable("%d prompts already held for their decodes", maxPDHolds)
	case h.byRoom && t.byRoom[h.room] != nil:
		t.mu.Unlock()
		e.sched.freeHeld(held)
		return badRequest(`"bootstrap_room" %d is already held on this engine`, h.room)
	}
	if h.byRoom {
		t.byRoom[h.room] = h
		if w := t.waits[h.room]; w != nil {
			close(w.ch)
			t.waits[h.room] = &roomWait{ch: closedCh, n: w.n} // later waiters find it at once
		}
	} else {
		h.blockIDs = make([]int64, held.Blocks())
		for i := range h.blockIDs {
			h.blockIDs[i] = t.nextBlock
			t.nextBlock++
		}
		t.byBlock[h.blockIDs[0]] = h
	}
	h.lease = e.cfg.Clock.AfterFunc(e.cfg.KVLease, func() { e.expirePD(h) })
	t.mu.Unlock()
	x.pd.blockIDs = h.blockIDs
	return nil
}

var closedCh = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// takePD removes h from the tables if it is still there; true: the caller owns its sequence.
func (t *pdTable) takeLocked(h *pdHold) bool {
	if h.byRoom {
		if t.byRoom[h.room] != h {
			return false
		}
		delete(t.byRoom, h.room)
	} else {
		if t.byBlock[h.blockIDs[0]] != h {
			return false
		}
		delete(t.byBlock, h.blockIDs[0])
	}
	h.lease.Stop()
	return true
}

// expirePD is a hold's lease running out: no decode came for it.
func (e *Engine) expirePD(h *pdHold) {
	e.pdt.mu.Lock()
	ok := e.pdt.takeLocked(h)
	e.pdt.mu.Unlock()
	if ok {
		e.sched.freeHeld(h.seq)
		e.met.expirations.Inc()
		e.log.Info("KV held for a remote decode expired", "room", h.room, "tokens", h.seq.Len())
	}
}

// dropPD frees every hold (the engine is closing); waiters end on e.stop.
func (e *Engine) dropPD() {
	t := e.pdt
	t.mu.Lock()
	var held []*pdHold
	for _, h := range t.byBlock {
		held = append(held, h)
	}
	for _, h := range t.byRoom {
		held = append(held, h)
	}
	for _, h := range held {
		t.takeLocked(h)
	}
	t.mu.Unlock()
	for _, h := range held {
		e.sched.freeHeld(h.seq)
	}
}

// sendRequest is POST /tlengine/pd/send: push the KV held under block ids (vllm) or a room
// (sglang) to Target, a decode engine's KV address.
type sendRequest struct {
	EngineID  string  `json:"engine_id,omitempty"`
	BlockIDs  []int64 `json:"block_ids,omitempty"`
	Room      *uint64 `json:"room,omitempty"`
	Target    string  `json:"target"`
	RequestID string  `json:"request_id"`
}

type sendAnswer struct {
	HandleID string `json:"handle_id"`
}

// sideChannel is the side channel's handler.
func (e *Engine) sideChannel() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /tlengine/pd/send", e.observed("/tlengine/pd/send", e.serveSend))
	return mux
}

func (e *Engine) serveSend(w http.ResponseWriter, r *http.Request) {
	body, err := readBodyLimit(r, maxSendBody)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	var req sendRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeAPIError(w, badRequest("invalid send request: %v", err))
		return
	}
	if _, _, err := net.SplitHostPort(req.Target); err != nil || len(req.Target) > maxHostLen+6 {
		writeAPIError(w, badRequest(`"target" must be the decode engine's KV host:port`))
		return
	}
	if len(req.RequestID) > maxEngineIDLen {
		writeAPIError(w, badRequest(`"request_id" is over %d bytes`, maxEngineIDLen))
		return
	}
	var h *pdHold
	if req.Room != nil {
		h, err = e.awaitRoom(r.Context(), *req.Room)
	} else {
		h, err = e.takeBlocks(req.EngineID, req.BlockIDs)
	}
	if err != nil {
		writeAPIError(w, err)
		return
	}
	defer e.sched.freeHeld(h.seq) // pushed or not, the decode has its copy or nobody will
	first := &kvv1.KvBlock{Model: e.cfg.Model, FirstToken: sampler.EOS}
	handle, err := e.push(r.Context(), req.Target, req.RequestID, h.seq.Tokens(), first)
	if err != nil {
		writeAPIError(w, errPDUnavailable("pushing the KV to %s: %v", req.Target, err))
		return
	}
	b, _ := json.Marshal(sendAnswer{HandleID: handle.GetHandleId()})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// takeBlocks takes the vllm hold named by its engine id and block ids.
func (e *Engine) takeBlocks(engineID string, ids []int64) (*pdHold, error) {
	if engineID != e.cfg.ID {
		return nil, &apiError{status: 404, typ: "invalid_request_error", code: "kv_not_found",
			msg: fmt.Sprintf("remote_engine_id %q is not this engine (%q)", engineID, e.cfg.ID)}
	}
	if len(ids) == 0 {
		return nil, badRequest(`"block_ids" must not be empty`)
	}
	t := e.pdt
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.byBlock[ids[0]]
	if h == nil || !slices.Equal(h.blockIDs, ids) || !t.takeLocked(h) {
		return nil, &apiError{status: 404, typ: "invalid_request_error", code: "kv_not_found",
			msg: "no KV is held under these block ids (unknown, already sent or expired)"}
	}
	return h, nil
}

// awaitRoom waits for room's prefill (at most PDTimeout) and takes its hold.
func (e *Engine) awaitRoom(ctx context.Context, room uint64) (*pdHold, error) {
	t := e.pdt
	t.mu.Lock()
	if h := t.byRoom[room]; h != nil && t.takeLocked(h) {
		t.mu.Unlock()
		return h, nil
	}
	w := t.waits[room]
	if w == nil {
		if len(t.waits) >= maxPDWaits {
			t.mu.Unlock()
			return nil, errPDUnavailable("%d bootstrap rooms already waited on", maxPDWaits)
		}
		w = &roomWait{ch: make(chan struct{})}
		t.waits[room] = w
	}
	w.n++
	ch := w.ch
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		if cur := t.waits[room]; cur != nil {
			if cur.n--; cur.n <= 0 {
				delete(t.waits, room)
			}
		}
		t.mu.Unlock()
	}()
	timer := make(chan struct{})
	tm := e.cfg.Clock.AfterFunc(e.cfg.PDTimeout, func() { close(timer) })
	defer tm.Stop()
	for {
		select {
		case <-ch:
			t.mu.Lock()
			h := t.byRoom[room]
			ok := h != nil && t.takeLocked(h)
			t.mu.Unlock()
			if ok {
				return h, nil
			}
			return nil, &apiError{status: 404, typ: "invalid_request_error", code: "kv_not_found",
				msg: fmt.Sprintf("bootstrap room %d was taken by another decode", room)}
		case <-timer:
			return nil, &apiError{status: 504, typ: "timeout", code: "bootstrap_timeout",
				msg: fmt.Sprintf("no prefill registered bootstrap room %d within %v", room, e.cfg.PDTimeout)}
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-e.stop:
			return nil, errStopping
		}
	}
}

// fetchRemote is the decode half: the prefill engine named by pd pushes the prompt's KV here,
// which becomes the request's handle (its tokens checked against this engine's own tokenizing
// of the prompt). Every failure is 503 kv_transfer_failed, naming why.
func (e *Engine) fetchRemote(ctx context.Context, pd *pdRequest, requestID string, prompt []uint32) (*kvHandle, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t := e.cfg.Clock.AfterFunc(e.cfg.PDTimeout, cancel) // on the engine's clock, as every wait here
	defer t.Stop()
	req := sendRequest{Target: e.KVAddr, RequestID: requestID}
	if pd.blockIDs != nil {
		req.EngineID, req.BlockIDs = pd.engineID, pd.blockIDs
	} else {
		room := pd.room
		req.Room = &room
	}
	b, _ := json.Marshal(req)
	url := "http://" + net.JoinHostPort(pd.host, strconv.Itoa(pd.port)) + "/tlengine/pd/send"
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, errPDUnavailable("fetching the KV: %v", err)
	}
	hr.Header.Set("Content-Type", "application/json")
	traceContext.Inject(ctx, propagation.HeaderCarrier(hr.Header)) // the request's trace, carried on (R24)
	resp, err := pdClient.Do(hr)
	if err != nil {
		return nil, errPDUnavailable("fetching the KV from %s: %v", net.JoinHostPort(pd.host, strconv.Itoa(pd.port)), err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxSendAnswer+1))
	if err != nil || len(raw) > maxSendAnswer {
		return nil, errPDUnavailable("fetching the KV: a bad answer from the prefill engine (%v, %d bytes)", err, len(raw))
	}
	if resp.StatusCode != http.StatusOK {
		return nil, errPDUnavailable("fetching the KV: the prefill engine answered %d: %s", resp.StatusCode, bytes.TrimSpace(raw))
	}
	var ans sendAnswer
	if err := json.Unmarshal(raw, &ans); err != nil || ans.HandleID == "" {
		return nil, errPDUnavailable("fetching the KV: the prefill engine's answer names no handle")
	}
	h, err := e.takeHandle(ans.HandleID, prompt)
	if err != nil {
		e.releaseHandle(ans.HandleID)
		return nil, errPDUnavailable("the fetched KV is not this request's prompt: %v", err)
	}
	h.regenerate = true
	return h, nil
}

// pdClient makes the decode half's side-channel calls (each bounded by PDTimeout); it keeps
// no idle connections, so no goroutine outlives a call.
var pdClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// vllmPrefillFormat is a prefill-for-remote-decode's answer: the ordinary JSON answer with
// kv_transfer_params naming the held KV.
type vllmPrefillFormat struct {
	format
	e *Engine
}

func (f vllmPrefillFormat) whole(x *run) ([]byte, string, error) {
	b, ct, err := f.format.whole(x)
	if err != nil || x.pd == nil || x.pd.blockIDs == nil {
		return b, ct, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, "", err
	}
	host, port, _ := net.SplitHostPort(f.e.BootstrapAddr)
	p, _ := strconv.Atoi(port)
	id := f.e.cfg.ID
	params, err := json.Marshal(vllmParams{DoRemotePrefill: true, RemoteEngineID: &id, RemoteBlockIDs: x.pd.blockIDs,
		RemoteHost: &host, RemotePort: &p, TPSize: ptr(1)})
	if err != nil {
		return nil, "", err
	}
	m["kv_transfer_params"] = params
	out, err := json.Marshal(m)
	return out, ct, err
}

func ptr[T any](v T) *T { return &v }

// preparePD sets run x up for its half of a disaggregated request (pd, nil: none): the
// prefill half holds its KV once prefilled (x.prefilled) and runs one token at most (its
// answer is the gateway's, not the client's); the decode half fetched its KV already
// (fetchRemote, before the run) and samples every token itself.
func (e *Engine) preparePD(x *run, pd *pdRequest) {
	if pd == nil || !pd.prefill {
		return
	}
	x.pd = pd
	x.req.params.MaxTokens = min(x.req.params.MaxTokens, 1)
	x.prefilled = func(seq *kv.Seq) error { return e.holdForRemote(x, seq) }
	if e.cfg.PD == PDVLLM {
		x.out = vllmPrefillFormat{format: x.out, e: e}
	}
}

// startSideChannel binds the side channel next to the HTTP listener's host when this engine
// serves prefills for --pd vllm or sglang.
func (e *Engine) startSideChannel(httpAddr string) (net.Listener, error) {
	if (e.cfg.PD != PDVLLM && e.cfg.PD != PDSGLang) || e.cfg.Role == RoleDecode {
		return nil, nil
	}
	host, _, err := net.SplitHostPort(httpAddr)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(e.cfg.BootstrapPort)))
	if err != nil {
		return nil, fmt.Errorf("engine: bootstrap listen: %w", err)
	}
	e.BootstrapAddr = l.Addr().String()
	return l, nil
}

// checkPDConfig validates --pd, --bootstrap-port and --pd-timeout.
func (c *Config) checkPDConfig() error {
	switch c.PD {
	case "":
		c.PD = PDTL
	case PDTL, PDVLLM, PDSGLang:
	default:
		return fmt.Errorf("engine: --pd %q: want tl, vllm or sglang", c.PD)
	}
	if c.BootstrapPort < 0 || c.BootstrapPort > 65535 {
		return fmt.Errorf("engine: --bootstrap-port %d: want 0 (any) to 65535", c.BootstrapPort)
	}
	switch {
	case c.PDTimeout == 0:
		c.PDTimeout = 30 * time.Second
	case c.PDTimeout < 0 || c.PDTimeout > time.Duration(math.MaxInt32)*time.Second:
		return errors.New("engine: --pd-timeout must be positive")
	}
	return nil
}
