package router

import (
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/actors/router/admission/thunderagent"
	"github.com/tlgw/tlgw/actors/router/policy"
	"github.com/tlgw/tlgw/internal/cascade"
	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/rollout"
	"github.com/tlgw/tlgw/internal/ttftmodel"
)

// Role is a worker's serving role (SPEC B1 enum Role without the UNSPECIFIED value, which the
// registry maps to RoleUnified).
type Role uint8

// Roles.
const (
	RoleUnified Role = iota
	RolePrefill
	RoleDecode
)

func (r Role) String() string {
	switch r {
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	}
	return "unified"
}

// WorkerInfo is what a worker actor knows about its engine and tells the router.
type WorkerInfo struct {
	ID string
	// Reg numbers this registration of ID: the registry gives each worker actor it spawns the
	// next number (1, 2, …; never reused while the gateway runs), and every message about a
	// worker names the registration it is about (WorkerState, LoadReport, ObservedTTFT,
	// WarmupSent, KVEvents). An id evicted and registered again is a new registration, whose
	// engine may be another process on other hardware: nothing of the old one applies to it
	// (see Registration). 0 only where no registry numbers them (tests).
	Reg           uint64
	Model         string
	Role          Role
	HTTPAddress   string
	GRPCAddress   string
	KVAddress     string
	KVFormat      uint32
	QueueDepth    int64
	Running       int64
	KVFreeBlocks  int64
	KVTotalBlocks int64
	// BlockSize is the engine's tokens per KV block (WorkerStatus.block_size, at most 1 << 20);
	// 0 = unknown, and then the worker has no known KV capacity (see KVCapacityTokens).
	BlockSize     int64
	Draining      bool // the engine reports draining
	DrainEcho     bool // its draining is the echo of the gateway's own drain (see SelfDraining)
	AdminDrained  bool // its model is drained through the admin API
	LastHeartbeat time.Time
	// Static: the engine does not heartbeat; its status comes from scraping its metrics and
	// LastHeartbeat is its last successful scrape. ScrapeError is the last scrape's failure
	// ("" after a success).
	Static      bool
	ScrapeError string
	// KVEvents: the engine serves tl.kv.v1.KvEvents/Subscribe on GRPCAddress (R18.3).
	KVEvents bool
	// KVEventsEndpoint is where the engine publishes vLLM-format KV events (R22: a heartbeat's
	// kv_events_endpoint, a static worker's), as internal/vllmkv.ParseEndpoint accepts it; ""
	// = none advertised (the engine may still connect to [gateway.kv_events] listen).
	KVEventsEndpoint string
	// BootstrapPort is the engine's SGLang bootstrap port (R22), which a pd_protocol =
	// "sglang" route names in bootstrap_port when the engine is its prefill worker: a static
	// worker's configured bootstrap_port. 0 = not known, which picks read as
	// config.DefaultBootstrapPort (8998). Decision: a heartbeating engine has no way to say
	// its port (WorkerStatus has no field for it, and a new proto field is a contract change
	// for every engine adapter), so it gets SGLang's default; an SGLang prefill engine on
	// another port is configured as a static worker (or an engine pool) with bootstrap_port.
	BootstrapPort int
	// LoRAAdapters are the LoRA adapters the engine serves besides Model (R21: a heartbeat's
	// lora_adapters; a scraped engine's /v1/models entries whose parent is Model), sorted,
	// without duplicates, at most MaxLoRAAdapters. MaxLoRAs is how many it runs at once (0 =
	// unknown). RunningLoRAs are the adapters it reports running (a scraped vLLM's
	// lora_requests_info; nil when not reported).
	LoRAAdapters []string
	MaxLoRAs     int
	RunningLoRAs []string
	// Endpoints are the serving endpoints the engine says it answers (R21; 0 = not said: every
	// endpoint is tried).
	Endpoints oai.EndpointSet
	// MaxModelLen is the context length the engine reports (a scraped engine's /v1/models;
	// 0 = unknown), listed by GET /v1/models.
	MaxModelLen int64
}

// MaxLoRAAdapters bounds the LoRA adapters one worker may advertise (R21).
const MaxLoRAAdapters = 1024

// ServesLoRA reports whether the engine serves adapter name (LoRAAdapters is sorted).
func (i WorkerInfo) ServesLoRA(name string) bool {
	_, ok := slices.BinarySearch(i.LoRAAdapters, name)
	return ok
}

// SelfDraining reports whether the engine drains of its own accord: it reports draining, and
// not as the echo of the gateway's own drain (DrainEcho; the registry decides which, see
// registry.drainEcho). Only that is a reason to stop routing to it (R1, R19): the echo would
// keep a worker out for up to two heartbeats after its model's drain is lifted.
func (i WorkerInfo) SelfDraining() bool { return i.Draining && !i.DrainEcho }

// KVCapacityTokens is the worker's KV capacity in tokens, KVTotalBlocks × BlockSize (SPEC
// R15.1); 0 when either is unknown (0 or below).
func (i WorkerInfo) KVCapacityTokens() int64 {
	if i.KVTotalBlocks <= 0 || i.BlockSize <= 0 {
		return 0
	}
	return i.KVTotalBlocks * i.BlockSize
}

// WorkerState is a worker actor's full report: sent when it registers, on every heartbeat, on
// a drain, on expiry and after a restart. Info.Reg is its registration: a report of an earlier
// registration than the router's (an old actor's last report, racing the new registration's
// first) changes nothing (see Registration).
type WorkerState struct {
	PID  *actor.PID
	Info WorkerInfo
	// Live is false once the heartbeat deadline has fired (R1); the registry then stops the actor.
	Live bool
	// InFlight and AcqSeen: the worker's in-flight count and how many Acquires it has
	// processed (the router's reservations not yet seen are acqSent − AcqSeen).
	InFlight int64
	AcqSeen  uint64
	// FailLoad is the load the worker's recent failures add (R19): load-based policies read
	// in flight + queue depth + FailLoad. It decays on the worker's clock.
	FailLoad int64
	// Unreachable: an attempt's connection to the worker's HTTP address was refused (nothing
	// listens there, R19) and no heartbeat has arrived since. The worker is out of routing,
	// outside the outlier ejection's max_ejected_percent.
	Unreachable bool
}

// Acquire counts one in-flight request on a worker (the worker actor owns the count, SPEC A).
// The router sends it when it picks the worker, so the count is up before the requester hears
// of the pick. The worker watches Requester and releases the ticket if it stops first, so a
// requester that crashes at any point cannot leak a count.
type Acquire struct {
	Ticket    uint64     // names this hold; Release gives it back
	Requester *actor.PID // the request actor (nil: the caller releases the ticket itself)
}

// Release ends the in-flight request of Ticket. A ticket the worker does not hold (already
// released, or released because its requester stopped) changes nothing. Outcome is what the
// attempt on this worker came to (R14.2): the worker counts consecutive failures from it.
type Release struct {
	Ticket  uint64
	Outcome Outcome
	// Unreachable: the attempt's connection was refused (ECONNREFUSED: nothing listens on the
	// worker's HTTP address), so the engine is provably down (R19). The worker leaves routing
	// until a heartbeat (or a good scrape) arrives after this Release.
	Unreachable bool
	// Addr is the worker's HTTP address the attempt went to ("": not said). A verdict whose
	// address the worker has left (its engine moved: a restart at a new address under the same
	// id) is about the engine that was there: the worker takes it as OutcomeNone.
	Addr string
}

// Outcome is the requester's verdict on one worker's part of a request (R14.2 outlier
// detection). A failure is refused, reset, timeout or 5xx before the first byte, or an
// interrupted stream; a success resets the worker's failure streak; OutcomeNone says nothing
// about the worker (the client left, the router's pick was given back unused, another
// worker's part of the request failed). A cascade step that answered 200 is a success, kept or
// escalated: the engine worked, the answer was judged.
type Outcome uint8

// The outcomes. Their names are the reason label of tlgw_outlier_ejections_total.
const (
	OutcomeNone        Outcome = iota
	OutcomeSuccess             // the engine answered below 500 (a stream: its first event) and was not cut
	OutcomeRefused             // the connection was refused (or could not be made)
	OutcomeReset               // the connection broke before the answer's first byte
	OutcomeTimeout             // a timeout (R14.1) fired before the first byte
	Outcome5xx                 // the engine answered 5xx
	OutcomeInterrupted         // a committed answer was cut by the engine
)

var outcomeNames = [...]string{"none", "success", "refused", "reset", "timeout", "5xx", "interrupted"}

func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "unknown"
}

// Failed reports whether o counts as a failure of the worker.
func (o Outcome) Failed() bool { return o > OutcomeSuccess && int(o) < len(outcomeNames) }

// IgnoreDeadLetterLogging keeps a Release to an evicted worker out of the dead-letter log:
// such a request was on its way to an engine the gateway no longer tracks.
func (Release) IgnoreDeadLetterLogging() {}

// IgnoreDeadLetterLogging implements actor.IgnoreDeadLetterLogging.
func (Acquire) IgnoreDeadLetterLogging() {}

// LoadReport is a worker's in-flight change after a Release. Eject, when not OutcomeNone, is
// the last failure of a streak of consecutive_failures (R14.2): the worker asks the router to
// eject it (the router decides: never more than max_ejected_percent of a model's workers).
//
// Reg is the registration of the worker actor that sent it (WorkerInfo.Reg). The router
// applies a report only to that registration: an id evicted and registered again has a new
// actor, whose counts start at 0, and a report its old actor sent late (the Release of a
// request still running at the eviction) says nothing of the new one: neither its load nor an
// ejection.
type LoadReport struct {
	ID       string
	Reg      uint64
	InFlight int64
	AcqSeen  uint64
	Eject    Outcome
	// FailLoad is the load the worker's recent failures add (R19; WorkerState.FailLoad). A
	// worker sends a LoadReport each time it decays too.
	FailLoad int64
}

// LastStep asks for a cascade route's last step (streams go straight there, R7).
const LastStep = -1

// Pick asks the router for a worker. The reply is *Picked.
type Pick struct {
	Model     string // the model id the client sent (a route id, an alias or a served id)
	RequestID string // draws the canary backend (R5); never a key of any table (R13.4)
	// Key is the request's internal id, unique among live requests: the admission queue and
	// its gate key requests by it. Every pick of one request carries the same Key.
	Key uint64
	// Requester is the request actor: the picked workers watch it to release its holds if it
	// stops first, and the router watches an admitted one to end its turn. nil only for
	// callers that release their tickets themselves (tests, benchmarks); admission needs it.
	Requester  *actor.PID
	PrefixHash uint64 // Hash64 of the prefix key (R4), for affinity
	// PrefixHashes are the chained 64-byte chunk hashes of the rendered prompt (R10 item 5),
	// for prefix_aware routing and the classifier's cached tokens; nil when neither is on.
	PrefixHashes []uint64
	// TokenIDs are the prompt's token ids as its engines tokenize it (R22: gateway.tokenizer =
	// "engine"; nil when not rendered): precise_prefix cuts them into the router's block keys
	// for pools whose engines report their own KV events.
	TokenIDs []uint32
	Exclude  []string // worker ids already tried (R6)
	Step     int      // cascade step (0 = first; LastStep); ignored by other routes
	Tag      uint64   // echoed in Picked, so a requester can tell a late answer from a current one
	// SLOTTFTMs is the request's TTFT objective in milliseconds (X-TL-SLO-TTFT-Ms, R18.4; 0 =
	// none): predicted_latency prefers the workers predicted to meet it.
	SLOTTFTMs int64
	// Endpoint is the serving endpoint asked for (R21; 0 = any): only workers serving it are
	// picked.
	Endpoint oai.Kind
	// Response pins the pick to the worker that stored this response (R21: GET/DELETE
	// /v1/responses/{id}, previous_response_id; responses.go), for the API key Owner (-1 in
	// open mode). Continues says the request is a new response continuing it (a POST with
	// previous_response_id): a generation, admitted like any other (Admit) and only to a
	// routable worker; a read or delete of the stored response passes no admission queue and
	// reaches its worker even while it drains.
	Response  string
	Owner     int
	Continues bool
	// Admit is set on every pick of a request that passes the admission queue (R10). The
	// first pick of a Key is admitted: the router answers *Queued at once if it waits, and
	// *Picked when it leaves. Later picks of the Key (failover, cascade steps, repeated picks)
	// keep the allowed workers it was admitted with and move the gate's bookkeeping.
	Admit *AdmitInfo
	// DecodeOnly asks a disaggregated route for a decode worker alone (no prefill worker):
	// a pd_protocol = "vllm" request whose decode failed before its first byte tries another
	// decode worker with the KV its prefill worker still holds (R22). Other routes ignore it.
	DecodeOnly bool
}

// AdmitInfo is what the admission classifier reads of a request.
type AdmitInfo struct {
	Class     string // from the API key or X-TL-Class ("" = the default class)
	SessionID string // X-Session-ID or the body's user ("" = none)
	// APIKey is the index of the configured API key the request came with (-1: none, open
	// mode): the queue's and the policies' per-key shares are counted by it (R20).
	APIKey int
	// PromptTokens is an estimate of every prompt of the request (oai.Cost: text bytes / 4
	// and token ids; a batch counts each of its prompts), OutputTokens the most it may
	// generate (prompts × n × max_tokens; 0 when unbounded).
	PromptTokens int
	OutputTokens int
	// Final marks the session's last turn (X-TL-Session-Final: true, R15.1); meaningful only
	// with a SessionID (without one, policies ignore it).
	Final bool
}

// Queued answers an admitted Pick that waits in the queue; *Picked follows when it leaves.
type Queued struct{ Tag uint64 }

// GetQueue asks for the admission queue's admin view; the reply is *QueueView.
type GetQueue struct{}

// QueueView answers GetQueue.
type QueueView struct {
	Enabled  bool
	Snapshot admission.Snapshot
}

// GetPrograms asks for the agent programs of the admission classifier (SPEC R15.1, GET
// /admin/v1/programs); the reply is *ProgramList.
type GetPrograms struct{}

// ProgramList answers GetPrograms.
type ProgramList struct {
	// Classifier is the admission policy's name ("" when admission is off).
	Classifier string
	// Tracks: the classifier keeps programs (thunderagent). A classifier that does not has
	// an empty list, as has one that keeps none now.
	Tracks bool
	// Programs are by session hash; never nil.
	Programs []thunderagent.ProgramView
}

// Picked answers Pick. On success the router has sent Worker (and Prefill.Worker for a
// disaggregated route) an Acquire for Ticket, and the requester sends Release{Ticket} when the
// attempt ends (a requester that stops first is released by the worker).
type Picked struct {
	Tag         uint64
	Ticket      uint64
	Err         error // ErrModelNotFound or ErrNoCapacity (package errs)
	Worker      *actor.PID
	WorkerID    string
	WorkerReg   uint64 // Worker's registration (WorkerInfo.Reg), echoed in ObservedTTFT
	HTTPAddress string
	GRPCAddress string
	KVAddress   string
	Route       string // the public route id the request resolved to
	ServedModel string // the model id the engine serves; the body's model is rewritten to it
	Reason      policy.Reason
	// Step and Steps: the cascade step served and how many the route has (1 without a
	// cascade). Accept is the step's accept rule; nil on the last step.
	Step, Steps int
	Accept      *cascade.Accept
	// Prefill is the prefill worker of a disaggregated route (Worker is then the decode
	// worker); nil otherwise.
	Prefill *PickedWorker
	// PDProtocol is the disaggregated route's protocol (config.PDTL, PDVLLM or PDSGLang; R22)
	// when the pick is disaggregated: Prefill is set, or the Pick was DecodeOnly. "" otherwise.
	PDProtocol string
	// Admitted: the request went through the admission queue; its turn ends when the
	// requester stops.
	Admitted bool
	// Features is what predicted_latency's model was asked about Worker for this pick (zero
	// under other policies); the requester echoes it in ObservedTTFT.
	Features ttftmodel.X
	// Warm, when set, asks the requester to copy the prompt's prefix to another worker ahead
	// of demand (a prefix warm-up, warm.go); nil on almost every pick.
	Warm *Warmup
	// LoadLoRA, when set, asks the requester to load this LoRA adapter on Worker before its
	// attempt (R21 lora_load_on_demand, lora.go) and report it (LoRALoaded).
	LoadLoRA *LoRALoad
	// Adapter is the LoRA adapter the pick was for ("" for a base model): an engine's 404 for
	// it says the router's belief is stale (LoRAMissing).
	Adapter string
	// Rollout counts the route's rollout window while it runs (R25): the requester observes
	// each attempt's outcome in it; nil for other routes.
	Rollout *rollout.Window
}

// GetRollouts asks for the rollouts of the route table (R25); the reply is *RolloutsView.
type GetRollouts struct{}

// RolloutsView is every route's rollout, by route id order. Version changes with every
// change of any of them (a decision, an action, a new table): the admin API's ETag.
type RolloutsView struct {
	Version uint64 `json:"version"`
	// Decider is the replica that judges the windows in a cluster ("" outside one, or while
	// none holds the lease).
	Decider  string        `json:"decider,omitempty"`
	Rollouts []RolloutView `json:"rollouts"`
}

// SetRolloutStates are the rollouts' states as a cluster stores them (R25, adapters/cluster),
// by route id, at the store's Version; Decider is the replica that decides. A route whose
// rollout a state fits follows it.
type SetRolloutStates struct {
	Version uint64
	Decider string
	States  map[string]rollout.Stored
}

// RolloutView is one route's rollout: its spec as configured, where it is, the window so far.
type RolloutView struct {
	Route        string           `json:"route"`
	Canary       string           `json:"canary"`
	Baseline     string           `json:"baseline"`
	Steps        []float64        `json:"steps"`
	Percent      float64          `json:"percent"`
	Status       rollout.Status   `json:"status"`
	Step         int              `json:"step"`
	WindowStart  time.Time        `json:"window_start"`
	WindowEnd    time.Time        `json:"window_end"`
	StepInterval string           `json:"step_interval"`
	History      []rollout.Record `json:"history"`
	// Version is the rollouts' version after this view (RolloutsView.Version).
	Version uint64 `json:"version"`
}

// RolloutAction is an operator's pause, resume, promote or abort of route's rollout (R25). The
// reply is *RolloutView, or an error wrapping errs.ErrNotFound (no such rollout) or
// errs.ErrInvalidRequest (an unknown action, or a rollout that has ended).
type RolloutAction struct {
	Route  string
	Action string
	// IfMatch, when set, is the version the operator saw (RolloutsView.Version): another
	// version is refused with errs.ErrEtagMismatch, and nothing changes.
	IfMatch *uint64
}

// ObservedTTFT is the gateway's own measurement of one attempt's time to first token (from
// the attempt's start to its stream's first event), sent by the request actor only under
// route_policy = "predicted_latency", for the picked worker's model (R18.2). Features are the
// pick's (Picked.Features). Reg is the picked worker's registration (Picked.WorkerReg): an
// observation of a registration the router no longer has (the id was evicted and registered
// again: a restarted engine, maybe on other hardware) is ignored, as is one of a worker the
// router no longer knows.
type ObservedTTFT struct {
	WorkerID string
	Reg      uint64
	Features ttftmodel.X
	TTFT     time.Duration
}

// IgnoreDeadLetterLogging: the router may be stopping.
func (*ObservedTTFT) IgnoreDeadLetterLogging() {}

// Warmup is a prefix warm-up reserved by a pick (Picked.Warm), sent to Worker: a one-token
// request whose rendered prompt is the first Bytes bytes of the request's (oai.WarmupBody), or,
// in a pool keyed by its engines' own events (R22), a completions request whose prompt is the
// first Tokens of the pick's token ids (Pick.TokenIDs; oai.TokenWarmupBody). Exactly one of
// Bytes and Tokens is positive. Ticket is named on the requester like any other; the warm-up
// releases it when it has ended, and the worker when the requester stops, whichever comes
// first.
type Warmup struct {
	PickedWorker
	Bytes int
	// Tokens is a whole number of the pool's KV blocks, at most len(Pick.TokenIDs).
	Tokens int
	// Hashes are the copied prefix's chunk hashes (the pick's, cut to Bytes), echoed in
	// WarmupSent; nil when the router keeps no approximate prefix index.
	Hashes []uint64
}

// WarmupSent tells the router that the requester has sent a pick's warm-up (Picked.Warm) to its
// worker; it echoes the Warmup's worker and hashes. The approximate prefix index learns that
// the worker holds the prefix from it, not from the pick: a warm-up the requester skipped
// (a prompt it cannot cut, as many warm-ups running as allowed) or never saw (a pick given
// back) would otherwise send later picks to a worker that holds nothing, as if it were
// cached. A worker the router no longer knows under that registration (Warmup.Reg) is
// ignored. No reply.
type WarmupSent struct {
	WorkerID string
	Reg      uint64
	Hashes   []uint64
}

// IgnoreDeadLetterLogging: the router may be stopping.
func (*WarmupSent) IgnoreDeadLetterLogging() {}

// PickedWorker is a second worker reserved by a pick.
type PickedWorker struct {
	Ticket      uint64
	Worker      *actor.PID
	WorkerID    string
	Reg         uint64 // Worker's registration (WorkerInfo.Reg)
	HTTPAddress string
	GRPCAddress string
	// BootstrapPort is the worker's SGLang bootstrap port (WorkerInfo.BootstrapPort, its
	// default filled in); set on a disaggregated pick's prefill worker.
	BootstrapPort int
}

// ListWorkers asks for every registered worker; the reply is *WorkerList.
type ListWorkers struct{}

// WorkerView is one row of GET /admin/v1/workers.
type WorkerView struct {
	Info     WorkerInfo
	InFlight int64
	Routable bool
	// EjectedUntil and EjectionReason describe an outlier ejection in force (R14.2): zero and
	// "" when the worker is not ejected. The reason is an Outcome's name.
	EjectedUntil   time.Time
	EjectionReason string
	// Unreachable: its address refused a connection and it has not heartbeaten since (R19).
	Unreachable bool
	// FailLoad is the load its recent failures add (R19), decaying; not part of InFlight.
	FailLoad int64
	// ReplicasInFlight is the other replicas' requests on it as they last shared them (R23);
	// not part of InFlight, which is this replica's own.
	ReplicasInFlight int64
	// TTFT is the worker's predicted_latency model (R18.2), nil before its first observation.
	TTFT *TTFTModelView
}

// TTFTModelView is a worker's online TTFT model: TTFT ≈ BiasMs + MsPerLoad × its load (in
// flight + queue depth) + MsPer1kUncachedTokens × thousands of prompt tokens it is not
// believed to hold, learnt from Observations measured TTFTs.
type TTFTModelView struct {
	Observations          uint64
	BiasMs                float64
	MsPerLoad             float64
	MsPer1kUncachedTokens float64
}

// WorkerList answers ListWorkers; workers are sorted by id.
type WorkerList struct {
	Epoch   uint64
	Workers []WorkerView
}

// GetRoutes asks for the route table; the reply is *RouteTable.
type GetRoutes struct{}

// RouteTable is the route table and its epoch.
type RouteTable struct {
	Epoch  uint64
	Routes []config.Route
}

// PutRoutes replaces the route table when IfMatch equals the current epoch. Routes must
// already be validated (config.ValidateRoutes). The reply is *RouteTable or an error
// (errs.ErrEtagMismatch).
type PutRoutes struct {
	IfMatch uint64
	Routes  []config.Route
}

// SetCanaryKey replaces the canary draw's key with the one the cluster's replicas share (R20,
// R16): from then on a request id draws the same backend on every replica. No reply.
type SetCanaryKey struct {
	Key CanaryKey
}

// SetRoutes installs a route table the cluster's store read from etcd (R16): Epoch is the
// key's mod revision, the ETag every replica shows. It is applied as sent (the store orders
// its calls by revision); no reply.
type SetRoutes struct {
	Epoch  uint64
	Routes []config.Route
}

// ListModels asks for the model ids clients may use; the reply is *ModelList.
type ListModels struct{}

// ModelList answers ListModels: route ids, their aliases, served models of registered
// workers and the LoRA adapters they serve, sorted and without duplicates. Info has an entry
// for each id that is a worker's model (its context length when known) or an adapter (its
// base model as Parent).
type ModelList struct {
	IDs  []string
	Info map[string]ModelInfo
}

// ModelInfo is what GET /v1/models shows of one id besides the id (R21).
type ModelInfo struct {
	Parent      string // an adapter's base model ("" for a base model)
	MaxModelLen int64  // 0 = unknown
}

// Ready asks whether at least one routable worker exists; the reply is *Readiness.
type Ready struct{}

// Readiness answers Ready.
type Readiness struct {
	Routable int
}

// KVEvents is what a worker's prefix cache now holds, from its tl.kv.v1.KvEvents stream
// (R18.3), for the exact index of route_policy = "precise_prefix". Ids are chunk ids over the
// rendered prompt (internal/prefixindex). Clear drops everything known of the worker first (a
// CLEARED event, a new subscription, or a sequence gap); then Removed, then Stored apply.
// The router applies it only to a registered, live worker that reports kv_events, and drops a
// message with more than MaxKVEventIDs ids (forgetting what it knew of the worker: a dropped
// REMOVED must not leave chunks the engine no longer holds).
//
// Reg is the registration the subscription was opened for (WorkerInfo.Reg): events of an
// earlier registration's engine (a stream still open when the id was evicted and registered
// again) are refused, as are those of a registration whose WorkerState the router has not
// handled yet (the subscriber retries its handshake after a backoff).
type KVEvents struct {
	WorkerID string
	Reg      uint64
	Clear    bool
	Stored   []uint64
	Removed  []uint64
	// Reply, when set, receives whether the message was applied (the worker is known and
	// live, and the exact index is on). It must have room for one value: the router never
	// blocks on it. A subscriber asks on its stream's first message, so a snapshot is never
	// sent before the router knows the worker. Otherwise no reply.
	Reply chan<- bool
	// Engine: the ids are the router's block keys from the engine's own (vLLM-format) KV events
	// (R22, adapters/kvzmq), which a worker need not announce with kv_events: the message is
	// applied to any live worker of the registration. BlockSize is the events' block size
	// (0 = none seen yet), which a request's token ids are cut by.
	Engine    bool
	BlockSize int
}

// RenderTarget asks where a request's prompt may be rendered into token ids (R22:
// gateway.tokenizer = "engine"). The reply is *RenderTargetReply.
type RenderTarget struct {
	Model     string   // as the client sent it
	RequestID string   // draws the canary backend as the request's pick will
	Endpoint  oai.Kind // chat or completions
}

// RenderTargetReply names a worker of the request's pool and the model it serves, when the
// pool's pick reads token ids (precise_prefix over engines that report their own KV events);
// otherwise Address is "" and the request needs no rendering.
type RenderTargetReply struct {
	Address     string // the worker's HTTP address
	ServedModel string // the model the worker serves, for the render body
}

// MaxKVEventIDs bounds the ids (Stored plus Removed) of one KVEvents message, as the contract
// bounds one KvEvent's.
const MaxKVEventIDs = 4096

// EpochChanged tells the registry the route table's new epoch, for heartbeat acks.
type EpochChanged struct {
	Epoch uint64
}
