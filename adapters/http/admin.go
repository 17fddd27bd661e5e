package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tlgw/tlgw/actors/router"
	"github.com/tlgw/tlgw/actors/router/admission/thunderagent"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/history"
)

// workerJSON is one row of GET /admin/v1/workers (SPEC B2).
type workerJSON struct {
	ID            string        `json:"id"`
	Role          string        `json:"role"`
	Model         string        `json:"model"`
	Addresses     addressesJSON `json:"addresses"`
	QueueDepth    int64         `json:"queue_depth"`
	Running       int64         `json:"running"`
	InFlight      int64         `json:"in_flight"`
	KVFreeBlocks  int64         `json:"kv_free_blocks"`
	KVTotalBlocks int64         `json:"kv_total_blocks"`
	BlockSize     int64         `json:"block_size"` // tokens per KV block; 0 = unknown
	Draining      bool          `json:"draining"`
	Drained       bool          `json:"drained"`
	Routable      bool          `json:"routable"`
	// R14.2: an outlier ejection in force (null and "" when none).
	EjectedUntil   *time.Time `json:"ejected_until"`
	EjectionReason string     `json:"ejection_reason"`
	LastHeartbeat  time.Time  `json:"last_heartbeat"`
	Static         bool       `json:"static,omitempty"`
	ScrapeError    string     `json:"scrape_error,omitempty"`
	// R19: its address refused a connection and it has not heartbeaten (or been scraped)
	// since; it is out of routing until it does.
	Unreachable bool `json:"unreachable,omitempty"`
	// R19: the load its recent failures add to in_flight for load-based policies (decaying).
	FailureLoad int64 `json:"failure_load,omitempty"`
	// R23: the other replicas' requests on it, as they last shared them (not in in_flight,
	// which is this replica's own).
	ReplicasInFlight int64 `json:"replicas_in_flight,omitempty"`
	// R18.2: predicted_latency's model of this worker, once it has learnt from a streamed request.
	TTFTModel *ttftModelJSON `json:"ttft_model,omitempty"`
}

type ttftModelJSON struct {
	Observations          uint64  `json:"observations"`
	BiasMs                float64 `json:"bias_ms"`
	MsPerLoad             float64 `json:"ms_per_load"`
	MsPer1kUncachedTokens float64 `json:"ms_per_1k_uncached_tokens"`
}

type addressesJSON struct {
	HTTP string `json:"http"`
	GRPC string `json:"grpc,omitempty"`
	KV   string `json:"kv,omitempty"`
}

func (s *Server) listWorkers(w http.ResponseWriter, _ *http.Request) {
	list, err := s.core.Workers()
	if err != nil {
		writeError(w, err)
		return
	}
	out := struct {
		Epoch   uint64       `json:"epoch"`
		Workers []workerJSON `json:"workers"`
	}{Epoch: list.Epoch, Workers: make([]workerJSON, 0, len(list.Workers))}
	for _, v := range list.Workers {
		in := v.Info
		var until *time.Time
		if !v.EjectedUntil.IsZero() {
			u := v.EjectedUntil.UTC()
			until = &u
		}
		var model *ttftModelJSON
		if m := v.TTFT; m != nil {
			model = &ttftModelJSON{Observations: m.Observations, BiasMs: m.BiasMs, MsPerLoad: m.MsPerLoad,
				MsPer1kUncachedTokens: m.MsPer1kUncachedTokens}
		}
		out.Workers = append(out.Workers, workerJSON{
			TTFTModel:    model,
			EjectedUntil: until, EjectionReason: v.EjectionReason,
			Unreachable: v.Unreachable, FailureLoad: v.FailLoad, ReplicasInFlight: v.ReplicasInFlight,
			ID: in.ID, Role: in.Role.String(), Model: in.Model,
			Addresses:  addressesJSON{HTTP: in.HTTPAddress, GRPC: in.GRPCAddress, KV: in.KVAddress},
			QueueDepth: in.QueueDepth, Running: in.Running, InFlight: v.InFlight,
			KVFreeBlocks: in.KVFreeBlocks, KVTotalBlocks: in.KVTotalBlocks, BlockSize: in.BlockSize,
			Draining: in.Draining, Drained: in.AdminDrained, Routable: v.Routable,
			LastHeartbeat: in.LastHeartbeat.UTC(), Static: in.Static, ScrapeError: in.ScrapeError,
		})
	}
	writeJSON(w, http.StatusOK, out)
}

type routesJSON struct {
	Epoch  uint64         `json:"epoch"`
	Routes []config.Route `json:"routes"`
}

func etag(epoch uint64) string { return `"` + strconv.FormatUint(epoch, 10) + `"` }

func (s *Server) writeRoutes(w http.ResponseWriter, epoch uint64, routes []config.Route) {
	if routes == nil {
		routes = []config.Route{}
	}
	w.Header().Set("ETag", etag(epoch))
	writeJSON(w, http.StatusOK, routesJSON{Epoch: epoch, Routes: routes})
}

func (s *Server) getRoutes(w http.ResponseWriter, _ *http.Request) {
	t, err := s.core.Routes()
	if err != nil {
		writeError(w, err)
		return
	}
	s.writeRoutes(w, t.Epoch, t.Routes)
}

// putRoutes replaces the whole route table under optimistic concurrency: If-Match must carry
// the ETag of the table the operator edited (428 without, 412 when another edit came first).
// The body is validated completely before the router sees it; a rejected PUT changes nothing.
func (s *Server) putRoutes(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Epoch  *uint64         `json:"epoch"` // accepted and ignored (SPEC B2)
		Routes *[]config.Route `json:"routes"`
	}
	if !s.readPut(w, r, "route table", errs.ErrInvalidRoute, &in) {
		return
	}
	if in.Routes == nil {
		writeError(w, fmt.Errorf(`route table: "routes" is required: %w`, errs.ErrInvalidRoute))
		return
	}
	routes := config.NormalizeRoutes(*in.Routes)
	if err := config.ValidateRoutes(routes); err != nil {
		writeError(w, fmt.Errorf("%v: %w", err, errs.ErrInvalidRoute))
		return
	}
	epoch, ok := s.ifMatch(w, r)
	if !ok {
		return
	}
	t, err := s.core.PutRoutes(epoch, routes)
	if err != nil {
		writeError(w, err)
		return
	}
	s.writeRoutes(w, t.Epoch, t.Routes)
}

// readPut is the common start of an admin PUT that replaces a whole table: If-Match must be
// present (428), and the body must be one JSON object with no unknown fields (400 with
// invalid, naming what). It reports whether the handler may go on.
func (s *Server) readPut(w http.ResponseWriter, r *http.Request, what string, invalid error, dst any) bool {
	if strings.TrimSpace(r.Header.Get("If-Match")) == "" {
		writeError(w, fmt.Errorf("PUT %s needs If-Match with the ETag from GET: %w", errs.Echo(r.URL.Path), errs.ErrIfMatchRequired))
		return false
	}
	body, err := s.readBody(w, r)
	if err != nil {
		writeError(w, err)
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		// The decoder's message may repeat the client's input (an unknown field's name).
		writeError(w, fmt.Errorf("%s: %s: %w", what, errs.Echo(err.Error()), invalid))
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		writeError(w, fmt.Errorf("%s: trailing data after the JSON object: %w", what, invalid))
		return false
	}
	return true
}

// ifMatch reads If-Match as the epoch it names; anything else is stale (412).
func (s *Server) ifMatch(w http.ResponseWriter, r *http.Request) (uint64, bool) {
	v := strings.TrimSpace(r.Header.Get("If-Match"))
	epoch, ok := parseETag(v)
	if !ok {
		writeError(w, fmt.Errorf("If-Match %s is not an ETag of this table: %w", errs.Echo(v), errs.ErrEtagMismatch))
	}
	return epoch, ok
}

func parseETag(v string) (uint64, bool) {
	unq, ok := strings.CutPrefix(v, `"`)
	if !ok {
		return 0, false
	}
	unq, ok = strings.CutSuffix(unq, `"`)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(unq, 10, 64)
	return n, err == nil
}

// drainModel serves POST /admin/v1/models/{model}:drain (and :undrain, which lifts it). The
// model is a served model id, as workers report it.
func (s *Server) drainModel(w http.ResponseWriter, r *http.Request) {
	rest := r.PathValue("action")
	var model string
	var drained bool
	switch {
	case strings.HasSuffix(rest, ":drain"):
		model, drained = strings.TrimSuffix(rest, ":drain"), true
	case strings.HasSuffix(rest, ":undrain"):
		model = strings.TrimSuffix(rest, ":undrain")
	default:
		writeError(w, fmt.Errorf("no route for %s (want …/{model}:drain or :undrain): %w", errs.Echo(r.URL.Path), errs.ErrNotFound))
		return
	}
	if model == "" {
		writeError(w, fmt.Errorf("empty model id: %w", errs.ErrModelNotFound))
		return
	}
	res, err := s.core.Drain(model, drained)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]any{"model": model, "drained": drained, "workers": res.Workers})
}

// getRollouts serves GET /admin/v1/rollouts (R25): each route's rollout — its canary and
// baseline, steps, the canary's share now, status, the current window, and its decisions with
// the figures each saw.
func (s *Server) getRollouts(w http.ResponseWriter, _ *http.Request) {
	v, err := s.core.Rollouts()
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("ETag", etag(v.Version))
	writeJSON(w, http.StatusOK, v)
}

// rolloutActions are the verbs of POST /admin/v1/rollouts/{route}:{verb}.
var rolloutActions = []string{"pause", "resume", "promote", "abort"}

// rolloutAction serves POST /admin/v1/rollouts/{route}:pause|resume|promote|abort (R25): the
// answer is the rollout after the action. :promote and :resume send the canary traffic, so
// they need If-Match with the ETag of GET /admin/v1/rollouts (428 without, 412 when a
// decision or another action came first); :pause and :abort take traffic away and may be
// sent without one (an emergency stop does not read first), but one given must match.
func (s *Server) rolloutAction(w http.ResponseWriter, r *http.Request) {
	rest := r.PathValue("action")
	i := strings.LastIndexByte(rest, ':')
	if i <= 0 || !slices.Contains(rolloutActions, rest[i+1:]) {
		writeError(w, fmt.Errorf("no route for %s (want …/{route}:pause, :resume, :promote or :abort): %w", errs.Echo(r.URL.Path), errs.ErrNotFound))
		return
	}
	action := rest[i+1:]
	var match *uint64
	if strings.TrimSpace(r.Header.Get("If-Match")) != "" {
		v, ok := s.ifMatch(w, r)
		if !ok {
			return
		}
		match = &v
	} else if action == "promote" || action == "resume" {
		writeError(w, fmt.Errorf("POST %s needs If-Match with the ETag from GET /admin/v1/rollouts: %w", errs.Echo(r.URL.Path), errs.ErrIfMatchRequired))
		return
	}
	v, err := s.core.RolloutAction(rest[:i], action, match)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("ETag", etag(v.Version))
	writeJSON(w, http.StatusOK, v)
}

type modelJSON struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// R21: a LoRA adapter's base model, and the context length where the engines report it.
	Parent      string `json:"parent,omitempty"`
	MaxModelLen int64  `json:"max_model_len,omitempty"`
}

// modelOf is the listing of model id.
func modelOf(list *router.ModelList, id string) modelJSON {
	mi := list.Info[id]
	return modelJSON{ID: id, Object: "model", OwnedBy: "tlgw", Parent: mi.Parent, MaxModelLen: mi.MaxModelLen}
}

func (s *Server) listModels(w http.ResponseWriter, _ *http.Request) {
	list, err := s.core.Models()
	if err != nil {
		writeError(w, err)
		return
	}
	out := struct {
		Object string      `json:"object"`
		Data   []modelJSON `json:"data"`
	}{Object: "list", Data: make([]modelJSON, 0, len(list.IDs))}
	for _, id := range list.IDs {
		out.Data = append(out.Data, modelOf(list, id))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getModel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("model")
	list, err := s.core.Models()
	if err != nil {
		writeError(w, err)
		return
	}
	for _, m := range list.IDs {
		if m == id {
			writeJSON(w, http.StatusOK, modelOf(list, id))
			return
		}
	}
	writeError(w, fmt.Errorf("the model %s does not exist: %w", errs.Echo(id), errs.ErrModelNotFound))
}

// getQueue serves GET /admin/v1/queue: classes, lanes, heads, held heads with reason and until.
func (s *Server) getQueue(w http.ResponseWriter, _ *http.Request) {
	v, err := s.core.Queue()
	if err != nil {
		writeError(w, err)
		return
	}
	if !v.Enabled {
		writeJSON(w, http.StatusOK, map[string]any{"enabled": false, "classes": []any{}})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"enabled": true, "classes": v.Snapshot.Classes})
}

// getPrograms serves GET /admin/v1/programs (R15.1): the admission classifier's agent
// programs (session hash, state, worker, tokens, paused_since), by session hash. The
// classifier is named (null when admission is off), with whether it keeps programs at all:
// one that does not answers an empty list.
func (s *Server) getPrograms(w http.ResponseWriter, _ *http.Request) {
	v, err := s.core.Programs()
	if err != nil {
		writeError(w, err)
		return
	}
	var classifier *string
	if v.Classifier != "" {
		classifier = &v.Classifier
	}
	ps := v.Programs
	if ps == nil {
		ps = []thunderagent.ProgramView{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"classifier": classifier, "tracks_programs": v.Tracks, "programs": ps})
}

func (s *Server) writeStatic(w http.ResponseWriter, epoch uint64, ws []config.StaticWorker) {
	if ws == nil {
		ws = []config.StaticWorker{}
	}
	w.Header().Set("ETag", etag(epoch))
	writeJSON(w, http.StatusOK, map[string]any{"epoch": epoch, "static_workers": ws})
}

func (s *Server) getStatic(w http.ResponseWriter, _ *http.Request) {
	epoch, ws := s.static.StaticWorkers()
	s.writeStatic(w, epoch, ws)
}

// putStatic replaces the static worker table under If-Match, like PUT /admin/v1/routes: 428
// without If-Match, 412 when stale, 400 invalid_static_worker for an invalid table or unknown
// fields; a rejected PUT changes nothing.
func (s *Server) putStatic(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Epoch   *uint64                `json:"epoch"` // accepted and ignored
		Workers *[]config.StaticWorker `json:"static_workers"`
	}
	if !s.readPut(w, r, "static workers", errs.ErrInvalidStaticWorker, &in) {
		return
	}
	if in.Workers == nil {
		writeError(w, fmt.Errorf(`static workers: "static_workers" is required: %w`, errs.ErrInvalidStaticWorker))
		return
	}
	if err := config.ValidateStaticWorkers(*in.Workers); err != nil {
		writeError(w, fmt.Errorf("%v: %w", err, errs.ErrInvalidStaticWorker))
		return
	}
	epoch, ok := s.ifMatch(w, r)
	if !ok {
		return
	}
	ws := config.NormalizeStaticWorkers(*in.Workers)
	next, err := s.static.PutStaticWorkers(epoch, ws)
	if err != nil {
		writeError(w, err)
		return
	}
	s.writeStatic(w, next, ws)
}

func (s *Server) writePools(w http.ResponseWriter, epoch uint64, ps []config.EnginePool) {
	if ps == nil {
		ps = []config.EnginePool{}
	}
	w.Header().Set("ETag", etag(epoch))
	writeJSON(w, http.StatusOK, map[string]any{"epoch": epoch, "engine_pools": ps})
}

func (s *Server) getPools(w http.ResponseWriter, _ *http.Request) {
	epoch, ps := s.pools.EnginePools()
	s.writePools(w, epoch, ps)
}

// putPools replaces the engine pool table (R23) under If-Match, like PUT
// /admin/v1/static-workers: 428 without If-Match, 412 when stale, 400 invalid_engine_pool for
// an invalid table or unknown fields (the body is bounded as every admin body is); a rejected
// PUT changes nothing.
func (s *Server) putPools(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Epoch *uint64              `json:"epoch"` // accepted and ignored
		Pools *[]config.EnginePool `json:"engine_pools"`
	}
	if !s.readPut(w, r, "engine pools", errs.ErrInvalidEnginePool, &in) {
		return
	}
	if in.Pools == nil {
		writeError(w, fmt.Errorf(`engine pools: "engine_pools" is required: %w`, errs.ErrInvalidEnginePool))
		return
	}
	if err := config.ValidateEnginePools(*in.Pools); err != nil {
		writeError(w, fmt.Errorf("%v: %w", err, errs.ErrInvalidEnginePool))
		return
	}
	epoch, ok := s.ifMatch(w, r)
	if !ok {
		return
	}
	ps := config.NormalizeEnginePools(*in.Pools)
	next, err := s.pools.PutEnginePools(epoch, ps)
	if err != nil {
		writeError(w, err)
		return
	}
	s.writePools(w, next, ps)
}

// getReplicas serves GET /admin/v1/replicas (R16): the replicas holding a lease in etcd, or
// this process alone without [cluster].
func (s *Server) getReplicas(w http.ResponseWriter, _ *http.Request) {
	var v Replicas
	if s.replicaFn != nil {
		v = s.replicaFn()
	}
	if v.List == nil {
		v.List = []Replica{}
	}
	writeJSON(w, http.StatusOK, v)
}

// getHistory serves GET /admin/v1/history (R24): every series, or with ?scope=routes those that
// are not per worker (what the live page draws: a fleet's worker series would be most of it).
func (s *Server) getHistory(w http.ResponseWriter, r *http.Request) {
	h := s.history()
	switch r.URL.Query().Get("scope") {
	case "", "all":
	case "routes":
		h.Series = slices.DeleteFunc(h.Series, func(x history.Series) bool { return x.Worker != "" })
	default:
		writeError(w, fmt.Errorf("scope is all (the default) or routes: %w", errs.ErrInvalidRequest))
		return
	}
	writeJSON(w, http.StatusOK, h)
}
