package router

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/oai"
)

// pickFor is a non-admitted pick of model for endpoint k, as a request actor sends it.
func (q *requester) pickFor(model string, k oai.Kind, exclude ...string) *Picked {
	q.tag++
	q.r.deliver(q.pid, &Pick{Model: model, RequestID: "r", Key: q.key, Requester: q.pid, Tag: q.tag, Exclude: exclude, Endpoint: k})
	return q.picked()
}

// TestPicksGoOnlyToWorkersServingTheEndpoint (R21): a worker that lists its endpoints gets only
// those; one that lists none gets every endpoint; when no worker of the model serves the
// endpoint the answer is a 404 saying so, not a 503 for capacity.
func TestPicksGoOnlyToWorkersServingTheEndpoint(t *testing.T) {
	r := newRig(t, Config{})
	chatOnly := oai.EndpointSet(0).With(oai.Completions).With(oai.Chat)
	r.joinWith("a-chat", "m", RoleUnified, 0, func(i *WorkerInfo) { i.Endpoints = chatOnly })
	r.joinWith("b-emb", "m", RoleUnified, 5, func(i *WorkerInfo) { i.Endpoints = oai.EndpointSet(0).With(oai.Embeddings) })
	q := r.newRequester()
	for range 3 {
		if p := q.pickFor("m", oai.Embeddings); p.Err != nil || p.WorkerID != "b-emb" {
			t.Fatalf("embeddings went to %q (%v), want b-emb though it is busier", p.WorkerID, p.Err)
		}
		if p := q.pickFor("m", oai.Chat); p.Err != nil || p.WorkerID != "a-chat" {
			t.Fatalf("chat went to %q (%v)", p.WorkerID, p.Err)
		}
	}
	p := q.pickFor("m", oai.Rerank)
	if !errors.Is(p.Err, errs.ErrNotFound) || !strings.Contains(p.Err.Error(), "/v1/rerank") {
		t.Fatalf("rerank nobody serves: %v, want a 404 naming the endpoint", p.Err)
	}
	// Excluded after a failed attempt is not "unserved": that stays a capacity answer.
	if p := q.pickFor("m", oai.Embeddings, "b-emb"); !errors.Is(p.Err, errs.ErrNoCapacity) {
		t.Fatalf("the only server excluded: %v, want no_capacity", p.Err)
	}
	r.joinWith("c-all", "m", RoleUnified, 9, func(*WorkerInfo) {})
	if p := q.pickFor("m", oai.Rerank); p.Err != nil || p.WorkerID != "c-all" {
		t.Fatalf("a worker listing no endpoints must be tried: %q %v", p.WorkerID, p.Err)
	}
	// A pool whose workers list every endpoint (tlengine's heartbeat) is not restricted: its
	// picks skip the endpoint scan.
	r.joinWith("e1", "full", RoleUnified, 0, func(i *WorkerInfo) { i.Endpoints = oai.AllEndpoints })
	r.joinWith("e2", "full", RoleUnified, 0, func(i *WorkerInfo) { i.Endpoints = oai.AllEndpoints })
	if p := q.pickFor("full", oai.Rerank); p.Err != nil {
		t.Fatalf("a pool listing every endpoint: %v", p.Err)
	}
	if pl := r.st.view.pools[poolKey{"full", RoleUnified}]; pl.restricted != 0 {
		t.Fatalf("a pool listing every endpoint counts %d restricted members", pl.restricted)
	}
}

// TestAnEnginesRefusalMarksTheEndpointForAWhile (R21): an engine that answered an endpoint
// with its server's 404/405 gets no request for it for UnsupportedFor (on the router's clock),
// then is tried again; other endpoints are not affected, a report about an earlier
// registration changes nothing, and the pool's restricted count goes back to zero.
func TestAnEnginesRefusalMarksTheEndpointForAWhile(t *testing.T) {
	r := newRig(t, Config{})
	r.join("w1", "m", 0)
	r.join("w2", "m", 3)
	q := r.newRequester()
	r.deliver(nil, &EndpointUnsupported{WorkerID: "w1", Reg: r.regOf("w1") + 1, Endpoint: oai.Embeddings})
	if p := q.pickFor("m", oai.Embeddings); p.WorkerID != "w1" {
		t.Fatalf("a report of another registration applied: %q", p.WorkerID)
	}
	r.deliver(nil, &EndpointUnsupported{WorkerID: "w1", Reg: r.regOf("w1"), Endpoint: oai.Embeddings})
	if p := q.pickFor("m", oai.Embeddings); p.WorkerID != "w2" {
		t.Fatalf("embeddings to %q after w1 refused it", p.WorkerID)
	}
	if p := q.pickFor("m", oai.Chat); p.WorkerID != "w1" {
		t.Fatalf("chat to %q: another endpoint's mark applied", p.WorkerID)
	}
	r.advance(UnsupportedFor - time.Millisecond)
	if p := q.pickFor("m", oai.Embeddings); p.WorkerID != "w2" {
		t.Fatalf("the mark ended early: %q", p.WorkerID)
	}
	r.advance(time.Millisecond)
	if p := q.pickFor("m", oai.Embeddings); p.WorkerID != "w1" {
		t.Fatalf("the mark did not end: %q", p.WorkerID)
	}
	if pl := r.st.view.pools[poolKey{"m", RoleUnified}]; pl.restricted != 0 {
		t.Fatalf("restricted %d after the marks ended", pl.restricted)
	}
}

// TestLoRAAdapterPicks (R21): a request naming an adapter goes only to workers of its base
// model that serve it, to the one where it is loaded while that one is not overrun, and not
// to a worker of another model; an unknown adapter is model_not_found.
func TestLoRAAdapterPicks(t *testing.T) {
	r := newRig(t, Config{LoadFactor: 1.25})
	lora := func(names ...string) func(*WorkerInfo) {
		return func(i *WorkerInfo) { i.LoRAAdapters, i.MaxLoRAs = names, 2 }
	}
	r.joinWith("w1", "base", RoleUnified, 0, lora("a", "b"))
	r.joinWith("w2", "base", RoleUnified, 0, lora("a"))
	r.joinWith("w3", "base", RoleUnified, 0, func(*WorkerInfo) {})
	r.joinWith("x1", "other", RoleUnified, 0, func(*WorkerInfo) {})
	q := r.newRequester()
	first := q.pickFor("a", oai.Completions)
	if first.Err != nil || first.WorkerID == "w3" || first.ServedModel != "a" || first.Route != "a" {
		t.Fatalf("adapter pick: %+v", first)
	}
	// The adapter is loaded there now: the next pick stays, though the other server is idle;
	// then its load (2) reaches the cap ⌈1.25·(m+1)/n⌉ = ⌈1.25·3/2⌉ = 2 over the two servers.
	var held []*Picked
	held = append(held, first)
	for i := range 1 {
		p := q.pickFor("a", oai.Completions)
		if p.WorkerID != first.WorkerID || p.Reason.String() != "lora" {
			t.Fatalf("pick %d went to %q (%v), want %q where a is loaded", i, p.WorkerID, p.Reason, first.WorkerID)
		}
		held = append(held, p)
	}
	other := map[string]string{"w1": "w2", "w2": "w1"}[first.WorkerID]
	if p := q.pickFor("a", oai.Completions); p.WorkerID != other {
		t.Fatalf("at the cap, a went to %q, want the other server %q", p.WorkerID, other)
	}
	for _, p := range held {
		q.release(p)
	}
	if p := q.pickFor("b", oai.Completions); p.WorkerID != "w1" {
		t.Fatalf("b went to %q, want w1, its only server", p.WorkerID)
	}
	if p := q.pickFor("c", oai.Completions); !errors.Is(p.Err, errs.ErrModelNotFound) {
		t.Fatalf("an adapter nobody serves: %v", p.Err)
	}
	// A worker that stops listing an adapter is out of its set at once.
	r.joinWith("w1", "base", RoleUnified, 0, lora("a"))
	if p := q.pickFor("b", oai.Completions); !errors.Is(p.Err, errs.ErrModelNotFound) {
		t.Fatalf("b after w1 dropped it: %+v", p)
	}
	r.leave("w1")
	r.leave("w2")
	if len(r.st.view.loraIdx) != 0 {
		t.Fatalf("adapter index after its workers left: %v", r.st.view.loraIdx)
	}
	models := r.st.listModels()
	if slices.Contains(models.IDs, "a") {
		t.Fatalf("models list a gone adapter: %v", models.IDs)
	}
}

// TestLoRAUnawarePicksLeastLoaded: with Config.LoRAUnaware (the simulator's baseline) an
// adapter's picks ignore where it is loaded and go to the least loaded worker serving it —
// the idle one, where the LoRA-aware pick of TestLoRAAdapterPicks stays on the loaded one —
// still never to a worker that does not serve it. The simulator's comparison is only fair
// if the baseline is exactly least-loaded among the adapter's servers.
func TestLoRAUnawarePicksLeastLoaded(t *testing.T) {
	r := newRig(t, Config{LoadFactor: 1.25, LoRAUnaware: true})
	lora := func(i *WorkerInfo) { i.LoRAAdapters, i.MaxLoRAs = []string{"a"}, 2 }
	r.joinWith("w1", "base", RoleUnified, 0, lora)
	r.joinWith("w2", "base", RoleUnified, 0, lora)
	r.joinWith("w3", "base", RoleUnified, 0, func(*WorkerInfo) {})
	q := r.newRequester()
	first := q.pickFor("a", oai.Completions)
	second := q.pickFor("a", oai.Completions)
	if first.Err != nil || second.Err != nil || first.WorkerID == second.WorkerID ||
		first.WorkerID == "w3" || second.WorkerID == "w3" {
		t.Fatalf("picks %q then %q, want w1 and w2 in some order", first.WorkerID, second.WorkerID)
	}
	if second.Reason.String() == "lora" {
		t.Fatalf("an unaware pick claimed the adapter was loaded: %v", second.Reason)
	}
}

// TestModelsListAdaptersWithParent: /v1/models shows each adapter with its base model, and the
// context length the engines report.
func TestModelsListAdaptersWithParent(t *testing.T) {
	r := newRig(t, Config{LoRALoadOnDemand: true, LoRAAdapters: []config.LoRAAdapter{
		{Name: "sql", Path: "/a/sql", BaseModel: "base"}, {Name: "z", Path: "/a/z", BaseModel: "absent"}}})
	r.joinWith("w1", "base", RoleUnified, 0, func(i *WorkerInfo) { i.LoRAAdapters, i.MaxModelLen = []string{"a"}, 4096 })
	r.joinWith("w2", "base", RoleUnified, 0, func(i *WorkerInfo) { i.LoRAAdapters, i.MaxModelLen = []string{"a", "b"}, 8192 })
	l := r.st.listModels()
	want := map[string]ModelInfo{"a": {Parent: "base", MaxModelLen: 8192}, "b": {Parent: "base", MaxModelLen: 8192},
		"sql": {Parent: "base", MaxModelLen: 8192}, "base": {MaxModelLen: 8192}}
	if !slices.Equal(l.IDs, []string{"a", "b", "base", "sql"}) || !maps.Equal(l.Info, want) {
		t.Fatalf("models %v %v", l.IDs, l.Info)
	}
}

// TestStoredResponsesPinTheirWorker (R21): a pick naming a stored response goes to the worker
// that stored it whatever its load (draining included), only for the key that stored it; a
// worker gone (or registered again: a new engine) is a 404 that says so; DELETE forgets.
func TestStoredResponsesPinTheirWorker(t *testing.T) {
	r := newRig(t, Config{})
	r.join("w1", "m", 50)
	r.join("w2", "m", 0)
	r.deliver(nil, &StoreResponse{ID: "resp_1", WorkerID: "w1", Reg: r.regOf("w1"), Owner: 3})
	q := r.newRequester()
	pin := func(id string, owner int) *Picked {
		q.tag++
		r.deliver(q.pid, &Pick{Model: "m", Key: q.key, Requester: q.pid, Tag: q.tag, Response: id, Owner: owner})
		return q.picked()
	}
	if p := pin("resp_1", 3); p.Err != nil || p.WorkerID != "w1" || p.ServedModel != "m" {
		t.Fatalf("pinned pick: %+v", p)
	}
	if p := pin("resp_1", 4); !errors.Is(p.Err, errs.ErrNotFound) {
		t.Fatalf("another key found the response: %+v", p)
	}
	w1 := r.workers[r.workerPID("w1").Id]
	w1.info.Draining = true
	r.report(w1)
	if p := pin("resp_1", 3); p.WorkerID != "w1" {
		t.Fatalf("a draining holder must still serve its response: %+v", p)
	}
	// After a failed attempt there, no other worker is tried: none holds the response.
	q.tag++
	r.deliver(q.pid, &Pick{Model: "m", Key: q.key, Requester: q.pid, Tag: q.tag, Response: "resp_1", Owner: 3, Exclude: []string{"w1"}})
	if p := q.picked(); !errors.Is(p.Err, errs.ErrNoCapacity) || p.WorkerID != "" {
		t.Fatalf("the holder excluded: %+v", p)
	}
	// A continuation naming a model the holder does not serve is refused, not rewritten.
	q.tag++
	r.deliver(q.pid, &Pick{Model: "other", Key: q.key, Requester: q.pid, Tag: q.tag, Response: "resp_1", Owner: 3})
	if p := q.picked(); !errors.Is(p.Err, errs.ErrInvalidRequest) || p.WorkerID != "" {
		t.Fatalf("another model: %+v", p)
	}
	r.leave("w1")
	r.join("w1", "m", 0)
	p := pin("resp_1", 3)
	if !errors.Is(p.Err, errs.ErrNotFound) || !strings.Contains(p.Err.Error(), "left") {
		t.Fatalf("holder re-registered: %v, want a 404 saying it left", p.Err)
	}
	if r.st.responses.len() != 0 {
		t.Fatalf("entry of a gone worker kept")
	}
	r.deliver(nil, &StoreResponse{ID: "resp_2", WorkerID: "w2", Reg: r.regOf("w2"), Owner: -1})
	r.deliver(nil, &ForgetResponse{ID: "resp_2", Owner: 0})
	if r.st.responses.len() != 1 {
		t.Fatalf("another key's delete forgot the entry")
	}
	r.deliver(nil, &ForgetResponse{ID: "resp_2", Owner: -1})
	if p := pin("resp_2", -1); !errors.Is(p.Err, errs.ErrNotFound) || !strings.Contains(p.Err.Error(), "known") {
		t.Fatalf("deleted response: %v", p.Err)
	}
}

// TestResponseTableIsBounded: the table keeps at most its size, one key at most a quarter of
// it (its own oldest forgotten first), the oldest entry forgotten when full; a repeated id
// does not take a second place or move the first entry; forgetting leaves no empty owner.
func TestResponseTableIsBounded(t *testing.T) {
	tab := newResponseTable(8) // a key's share: 2
	has := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			if _, ok := tab.byID[id]; !ok {
				t.Fatalf("%s forgotten; held %d", id, tab.len())
			}
		}
	}
	for _, id := range []string{"a1", "a2", "a1", "a3"} {
		tab.store(&StoreResponse{ID: id, WorkerID: "w-" + id, Owner: 1})
	}
	if _, ok := tab.byID["a1"]; ok || tab.len() != 2 {
		t.Fatalf("a key past its share: len %d, a1 kept %v", tab.len(), ok)
	}
	has("a2", "a3")
	for o := 2; o <= 4; o++ {
		for i := range 2 {
			tab.store(&StoreResponse{ID: fmt.Sprintf("k%d-%d", o, i), Owner: o})
		}
	}
	if tab.len() != 8 {
		t.Fatalf("len %d, want 8", tab.len())
	}
	tab.store(&StoreResponse{ID: "e1", Owner: 5})
	if _, ok := tab.byID["a2"]; ok || tab.len() != 8 {
		t.Fatalf("full table: len %d, the oldest (a2) kept %v", tab.len(), ok)
	}
	has("a3", "k2-0", "e1")
	// A key flooding the table takes its share (the two oldest entries go), then forgets
	// only its own.
	for i := range 100 {
		tab.store(&StoreResponse{ID: fmt.Sprintf("flood-%d", i), Owner: 6})
	}
	has("k2-1", "k3-0", "k3-1", "k4-0", "k4-1", "e1", "flood-98", "flood-99")
	if n := tab.owners[6].Len(); n != 2 || tab.len() != 8 {
		t.Fatalf("the flooding key holds %d, table %d", n, tab.len())
	}
	tab.forget(&ForgetResponse{ID: "e1", Owner: 2})
	has("e1")
	for id, e := range tab.byID {
		tab.forget(&ForgetResponse{ID: id, Owner: e.owner})
	}
	if tab.len() != 0 || tab.all.Len() != 0 || len(tab.owners) != 0 {
		t.Fatalf("after forgetting all: len %d, list %d, owners %d", tab.len(), tab.all.Len(), len(tab.owners))
	}
}

// TestLoRALoadOnDemand (R21): with lora_load_on_demand, a configured adapter nobody serves
// goes to the least loaded worker of its base model with a load to do first; the requests that
// follow go there too and ask for the load until it is reported done; a heartbeat that does not
// list the adapter yet keeps it; a failed load takes it off the worker; an adapter that is not
// configured stays unknown.
func TestLoRALoadOnDemand(t *testing.T) {
	r := newRig(t, Config{LoRALoadOnDemand: true, LoRAAdapters: []config.LoRAAdapter{{Name: "sql", Path: "/a/sql", BaseModel: "m"}}})
	r.join("w1", "m", 4)
	r.join("w2", "m", 1)
	q := r.newRequester()
	p := q.pickFor("sql", oai.Chat)
	if p.Err != nil || p.WorkerID != "w2" || p.LoadLoRA == nil || *p.LoadLoRA != (LoRALoad{Name: "sql", Path: "/a/sql"}) || p.ServedModel != "sql" {
		t.Fatalf("first pick: %+v", p)
	}
	if p := q.pickFor("sql", oai.Chat); p.WorkerID != "w2" || p.LoadLoRA == nil {
		t.Fatalf("a pick while the load is pending: %+v", p)
	}
	r.deliver(nil, &LoRALoaded{WorkerID: "w2", Reg: r.regOf("w2"), Name: "sql", OK: true})
	if p := q.pickFor("sql", oai.Chat); p.WorkerID != "w2" || p.LoadLoRA != nil {
		t.Fatalf("after the load: %+v", p)
	}
	r.join("w2", "m", 1) // a heartbeat that does not list sql yet
	if p := q.pickFor("sql", oai.Chat); p.WorkerID != "w2" || p.LoadLoRA != nil {
		t.Fatalf("after a heartbeat without the adapter: %+v", p)
	}
	// Its one worker excluded (a failover), the adapter is loaded on another rather than the
	// request refused; from then on both serve it.
	if p := q.pickFor("sql", oai.Chat, "w2"); p.Err != nil || p.WorkerID != "w1" || p.LoadLoRA == nil {
		t.Fatalf("a pick excluding the adapter's worker: %+v", p)
	}
	r.deliver(nil, &LoRALoaded{WorkerID: "w1", Reg: r.regOf("w1"), Name: "sql", OK: true})
	if got := len(r.st.view.loraIdx["sql"]); got != 2 {
		t.Fatalf("sql on %d workers, want 2", got)
	}
	r.deliver(nil, &LoRALoaded{WorkerID: "w1", Reg: r.regOf("w1"), Name: "sql", OK: false})
	r.deliver(nil, &LoRALoaded{WorkerID: "w2", Reg: r.regOf("w2"), Name: "sql", OK: false})
	if p := q.pickFor("sql", oai.Chat); p.LoadLoRA == nil {
		t.Fatalf("a failed load left the adapter counted: %+v", p)
	}
	if p := q.pickFor("nosuch", oai.Chat); !errors.Is(p.Err, errs.ErrModelNotFound) {
		t.Fatalf("an unconfigured adapter: %+v", p)
	}
	// A worker of another base model listing the configured adapter draws none of its
	// requests: the configured base model is the adapter's.
	r.joinWith("x1", "other", RoleUnified, 0, func(i *WorkerInfo) { i.LoRAAdapters, i.MaxLoRAs = []string{"sql"}, 2 })
	for range 4 {
		if p := q.pickFor("sql", oai.Chat); p.Err != nil || p.WorkerID == "x1" {
			t.Fatalf("a configured adapter went to another base's worker: %+v", p)
		}
	}
	r.leave("x1")
	r.leave("w1")
	r.leave("w2")
	if len(r.st.view.loraIdx) != 0 {
		t.Fatalf("index after the workers left: %v", r.st.view.loraIdx)
	}
}

// TestAnEnginesRefusedAdapter (R21): an engine that answered 404 for an adapter it lists
// (LoRAMissing) gets no request for it for UnsupportedFor, then is tried again; with every
// lister refused the answer is a 404 naming the adapter; a report about an earlier
// registration changes nothing; an adapter loaded on demand and refused is loaded again by the
// next pick; the picks name their adapter.
func TestAnEnginesRefusedAdapter(t *testing.T) {
	r := newRig(t, Config{LoRALoadOnDemand: true, LoRAAdapters: []config.LoRAAdapter{{Name: "sql", Path: "/a/sql", BaseModel: "m"}}})
	lora := func(i *WorkerInfo) { i.LoRAAdapters, i.MaxLoRAs = []string{"a"}, 2 }
	r.joinWith("w1", "m", RoleUnified, 0, lora)
	r.joinWith("w2", "m", RoleUnified, 3, lora)
	q := r.newRequester()
	p := q.pickFor("a", oai.Chat)
	if p.WorkerID != "w1" || p.Adapter != "a" {
		t.Fatalf("first pick: %+v", p)
	}
	q.release(p)
	r.deliver(nil, &LoRAMissing{WorkerID: "w1", Reg: r.regOf("w1") + 1, Name: "a"})
	if p := q.pickFor("a", oai.Chat); p.WorkerID != "w1" {
		t.Fatalf("a report of another registration applied: %+v", p)
	} else {
		q.release(p)
	}
	r.deliver(nil, &LoRAMissing{WorkerID: "w1", Reg: r.regOf("w1"), Name: "a"})
	for range 3 {
		p := q.pickFor("a", oai.Chat)
		if p.WorkerID != "w2" {
			t.Fatalf("adapter a went to %q after w1's engine refused it", p.WorkerID)
		}
		q.release(p)
	}
	if p := q.pickFor("m", oai.Chat); p.WorkerID != "w1" || p.Adapter != "" {
		t.Fatalf("the base model is not affected: %+v", p)
	} else {
		q.release(p)
	}
	r.deliver(nil, &LoRAMissing{WorkerID: "w2", Reg: r.regOf("w2"), Name: "a"})
	if p := q.pickFor("a", oai.Chat); !errors.Is(p.Err, errs.ErrModelNotFound) || !strings.Contains(p.Err.Error(), `LoRA adapter "a"`) {
		t.Fatalf("every lister refused: %+v, want a 404 naming the adapter", p)
	}
	r.advance(UnsupportedFor)
	if p := q.pickFor("a", oai.Chat); p.Err != nil {
		t.Fatalf("the marks passed: %+v", p)
	} else {
		q.release(p)
	}
	// A second mark on w1 drops its passed one: the marks stay as few as the adapters.
	r.deliver(nil, &LoRAMissing{WorkerID: "w1", Reg: r.regOf("w1"), Name: "a"})
	if n := len(r.st.view.slots["w1"].loraGone); n != 1 {
		t.Fatalf("w1 keeps %d marks, want 1", n)
	}

	p = q.pickFor("sql", oai.Chat)
	if p.LoadLoRA == nil || p.Adapter != "sql" {
		t.Fatalf("on-demand pick: %+v", p)
	}
	worker := p.WorkerID
	r.deliver(nil, &LoRALoaded{WorkerID: worker, Reg: r.regOf(worker), Name: "sql", OK: true})
	q.release(p)
	if p := q.pickFor("sql", oai.Chat); p.LoadLoRA != nil || p.WorkerID != worker {
		t.Fatalf("after the load: %+v", p)
	} else {
		q.release(p)
	}
	r.deliver(nil, &LoRAMissing{WorkerID: worker, Reg: r.regOf(worker), Name: "sql"})
	if p := q.pickFor("sql", oai.Chat); p.LoadLoRA == nil {
		t.Fatalf("an on-demand adapter its engine lost is not loaded again: %+v", p)
	}
}

// TestDisaggregatedAdapterPrefillRunsIt (R21): a disaggregated route that names an adapter
// picks its prefill worker among those serving the adapter (an idle one without it is passed
// over), and an adapter pick records nothing in the approximate prefix index (its KV is its
// own).
func TestDisaggregatedAdapterPrefillRunsIt(t *testing.T) {
	r := newRig(t, Config{Policy: "prefix_aware", PrefixIndexBlocks: 64, Routes: []config.Route{{Model: "pd-lora", Targets: []string{config.TargetDisaggregated}}}})
	lora := func(i *WorkerInfo) { i.LoRAAdapters, i.MaxLoRAs = []string{"pd-lora"}, 2 }
	r.joinWith("d1", "base", RoleDecode, 0, lora)
	r.joinWith("p1", "base", RolePrefill, 0, func(*WorkerInfo) {})
	r.joinWith("p2", "base", RolePrefill, 5, lora)
	for range 3 {
		p := r.st.pick(&Pick{Model: "pd-lora", Endpoint: oai.Chat, PrefixHashes: []uint64{1, 2, 3}}, r)
		if p.Err != nil || p.WorkerID != "d1" || p.Prefill == nil || p.Prefill.WorkerID != "p2" {
			t.Fatalf("pick: %+v prefill %+v", p, p.Prefill)
		}
	}
	if r.st.view.pidx == nil || r.st.view.pidx.Entries() != 0 {
		t.Fatalf("an adapter's prompts recorded in the prefix index (%v)", r.st.view.pidx)
	}
}

// TestLoRASlotsAndMarks (R21): a worker's free slots are counted from what its engine reports
// running when it reports it (else from what the gateway sent it), so a worker whose engine
// runs max_loras other adapters has none free; the adapters sent to a worker keep one place
// each; an on-demand load goes to the least loaded worker, the smaller id on a tie; an engine's
// refusal drops the adapter from what the worker is believed to hold, and a new mark drops the
// passed ones of other adapters; an adapter whose one server is excluded is a capacity answer,
// not a missing model.
func TestLoRASlotsAndMarks(t *testing.T) {
	r := newRig(t, Config{LoRALoadOnDemand: true, LoRAAdapters: []config.LoRAAdapter{{Name: "sql", Path: "/a/sql", BaseModel: "m"}}})
	r.joinWith("w1", "m", RoleUnified, 0, func(i *WorkerInfo) {
		i.LoRAAdapters, i.MaxLoRAs, i.RunningLoRAs = []string{"a", "b", "x", "y"}, 2, []string{"x", "y"}
	})
	r.joinWith("w2", "m", RoleUnified, 1, func(i *WorkerInfo) {
		i.LoRAAdapters, i.MaxLoRAs, i.RunningLoRAs = []string{"a", "b"}, 2, []string{}
	})
	q := r.newRequester()
	p := q.pickFor("a", oai.Chat)
	if p.WorkerID != "w2" {
		t.Fatalf("adapter a went to %q: w1's engine runs its 2 slots' worth, w2 has a free one", p.WorkerID)
	}
	q.release(p)
	w2 := r.st.view.slots["w2"]
	for range 3 {
		w2.touchLoRA("a")
	}
	if !slices.Equal(w2.loras, []string{"a"}) {
		t.Fatalf("w2's adapters %v after a was sent thrice", w2.loras)
	}
	r.deliver(nil, &LoRAMissing{WorkerID: "w2", Reg: r.regOf("w2"), Name: "b"})
	r.advance(UnsupportedFor)
	r.deliver(nil, &LoRAMissing{WorkerID: "w2", Reg: r.regOf("w2"), Name: "a"})
	if len(w2.loraGone) != 1 || w2.loraGone[0].name != "a" || slices.Contains(w2.loras, "a") {
		t.Fatalf("w2's marks %v and adapters %v after refusing a", w2.loraGone, w2.loras)
	}
	// A mark in force of another adapter stays; the same adapter marked again keeps one.
	r.deliver(nil, &LoRAMissing{WorkerID: "w2", Reg: r.regOf("w2"), Name: "b"})
	r.deliver(nil, &LoRAMissing{WorkerID: "w2", Reg: r.regOf("w2"), Name: "b"})
	if len(w2.loraGone) != 2 || w2.loraGone[0].name != "a" || w2.loraGone[1].name != "b" {
		t.Fatalf("w2's marks %v, want a and b once each", w2.loraGone)
	}
	r.advance(UnsupportedFor)
	if p := q.pickFor("b", oai.Chat, "w1", "w2"); !errors.Is(p.Err, errs.ErrNoCapacity) {
		t.Fatalf("b with both servers excluded: %+v", p)
	}
	r.join("w1", "m", 0)
	r.join("w2", "m", 0)
	if p := q.pickFor("sql", oai.Chat); p.WorkerID != "w1" || p.LoadLoRA == nil {
		t.Fatalf("an on-demand load on a tie: %+v", p)
	}
}
