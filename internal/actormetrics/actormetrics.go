// Package actormetrics feeds Prometheus directly from protoactor mailboxes,
// receivers and the system's event stream (R11): mailbox length and message
// handling time per actor kind, live actors, supervision directives and dead
// letters. It replaces protoactor's OpenTelemetry metrics, which are slow,
// leak a callback per spawned actor, and never export the mailbox gauge.
//
// Use it at the composition root:
//
//	m := actormetrics.New(registry)
//	defer m.WatchSystem(system)()
//	props := actor.PropsFromProducer(newWorker, m.Options("worker")...)
package actormetrics

import (
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names are part of the product contract (R11).
const (
	MailboxLengthName  = "tlgw_actor_mailbox_length"
	MessageSecondsName = "tlgw_actor_message_seconds"
	ActorsName         = "tlgw_actors"
	RestartsName       = "tlgw_actor_restarts_total"
	DeadLettersName    = "tlgw_actor_dead_letters_total"
)

// Metrics holds the collectors for every actor kind. Create one per
// registry with New; it is safe for concurrent use.
type Metrics struct {
	handle      *prometheus.HistogramVec
	restarts    *prometheus.CounterVec
	directives  [len(directiveLabels)]prometheus.Counter // by actor.Directive, resolved once
	deadLetters prometheus.Counter

	mailboxDesc, actorsDesc *prometheus.Desc

	mu    sync.Mutex
	kinds map[string]*kind // by actor kind: the composition root's fixed set
	order []*kind          // collection order: first use
}

// directiveLabels are the values of the directive label, indexed by
// actor.Directive.
var directiveLabels = [...]string{
	actor.ResumeDirective:   "resume",
	actor.RestartDirective:  "restart",
	actor.StopDirective:     "stop",
	actor.EscalateDirective: "escalate",
}

// New creates the metrics and registers their collectors with reg; like
// prometheus.MustRegister it panics if a name is already registered there.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		handle: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: MessageSecondsName,
			Help: "Time an actor took to handle a message, by actor kind and message type.",
			// 1 µs to about 1 s: actor handlers are meant to be quick, and
			// anything slow is a stalled mailbox.
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 11),
		}, []string{"actor_kind", "message"}),
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: RestartsName,
			Help: "Supervision directives applied to failed actors (resume, restart, stop, escalate).",
		}, []string{"directive"}),
		deadLetters: prometheus.NewCounter(prometheus.CounterOpts{
			Name: DeadLettersName,
			Help: "Messages sent to actors that no longer exist.",
		}),
		mailboxDesc: prometheus.NewDesc(MailboxLengthName,
			"User messages queued in the mailboxes of live actors, by actor kind.",
			[]string{"actor_kind"}, nil),
		actorsDesc: prometheus.NewDesc(ActorsName,
			"Live actors, by actor kind.",
			[]string{"actor_kind"}, nil),
		kinds: make(map[string]*kind),
	}
	for d, label := range directiveLabels {
		m.directives[d] = m.restarts.WithLabelValues(label)
	}
	reg.MustRegister(m.handle, m.restarts, m.deadLetters, (*mailboxCollector)(m))
	return m
}

// Options returns the props options that instrument actors of the given
// kind: the kind's mailbox (mailbox.go: unbounded, protoactor's semantics),
// which keeps the actor in the live set from start to *actor.Stop and times
// every message it hands to the actor, lifecycle and system messages
// included. Append further options after these, e.g. a dispatcher.
func (m *Metrics) Options(kindName string) []actor.PropsOption {
	k := m.kind(kindName)
	return []actor.PropsOption{
		actor.WithMailbox(func() actor.Mailbox { return newProbe(k) }),
	}
}

// WatchSystem counts sys's supervision directives and dead letters until the
// returned function is called. Dead-letter events are published on the
// sender's goroutine, so the handler only increments counters.
func (m *Metrics) WatchSystem(sys *actor.ActorSystem) (unsubscribe func()) {
	sub := sys.EventStream.Subscribe(func(evt any) {
		switch e := evt.(type) {
		case *actor.SupervisorEvent:
			if d := int(e.Directive); d >= 0 && d < len(m.directives) {
				m.directives[d].Inc()
			} else {
				m.restarts.WithLabelValues("unknown").Inc()
			}
		case *actor.DeadLetterEvent:
			m.deadLetters.Inc()
		}
	})
	var once sync.Once
	return func() { once.Do(func() { sys.EventStream.Unsubscribe(sub) }) }
}

func (m *Metrics) kind(name string) *kind {
	m.mu.Lock()
	defer m.mu.Unlock()
	k, ok := m.kinds[name]
	if !ok {
		k = &kind{name: name, handle: m.handle}
		k.head.prev, k.head.next = &k.head, &k.head
		m.kinds[name] = k
		m.order = append(m.order, k)
	}
	return k
}

func (m *Metrics) kindList() []*kind {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.order
}

// kind is the state shared by all actors of one kind.
type kind struct {
	name   string
	handle *prometheus.HistogramVec

	// The live mailboxes: an intrusive ring through head, so registering
	// and removing are O(1) and allocate nothing. A mailbox leaves it at its
	// actor's *actor.Stop, so it holds the live actors of the kind.
	mu   sync.Mutex
	head probe
	live int

	// observers maps a message's dynamic type to its histogram child. It is
	// copied on write: a handful of types per kind, read on every message.
	// Bounded by the message types in the code (so is the message label).
	observers atomic.Pointer[map[reflect.Type]prometheus.Observer]
	obsMu     sync.Mutex
}

// Probe states: a probe is registered at most once and never after it is
// gone, whatever order Start and the *actor.Stop arrive in.
const (
	probeNew uint8 = iota
	probeLive
	probeGone
)

// started puts the mailbox in the live set (once, and never after it is gone).
func (p *probe) started() {
	k := p.kind
	k.mu.Lock()
	if p.state == probeNew {
		p.state = probeLive
		p.prev, p.next = k.head.prev, &k.head
		k.head.prev.next = p
		k.head.prev = p
		k.live++
	}
	k.mu.Unlock()
}

// received drops the mailbox from the live set on *actor.Stop: every
// way an actor stops (Stop, Poison, a parent stopping, a Stop directive)
// posts one through its mailbox. The mailbox only calls this when handling
// the message did not panic; a panic in a *Stopping or *Stopped handler
// leaves protoactor itself with a half-stopped actor, which then stays
// counted as live.
func (p *probe) received(msg any) {
	if _, ok := msg.(*actor.Stop); !ok {
		return
	}
	k := p.kind
	k.mu.Lock()
	if p.state == probeLive {
		p.prev.next, p.next.prev = p.next, p.prev
		p.prev, p.next = nil, nil
		k.live--
	}
	p.state = probeGone
	k.mu.Unlock()
}

// sample sums the queued user messages of the live mailboxes. The counts
// are the mailboxes' own atomic counters, read at scrape time, so they
// cannot drift however messages leave (a panic, a stop that drops them).
func (k *kind) sample() (queued, live int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for p := k.head.next; p != &k.head; p = p.next {
		queued += p.UserMessageCount()
	}
	return queued, k.live
}

// epoch is the base of handler timings. time.Since(epoch) reads only the
// monotonic clock, which is cheaper than time.Now's wall and monotonic pair.
var epoch = time.Now()

// observer returns the histogram child for msg's type, creating it on the
// first message of that type; later ones cost a map lookup.
func (k *kind) observer(msg any) prometheus.Observer {
	t := reflect.TypeOf(msg)
	if m := k.observers.Load(); m != nil {
		if o, ok := (*m)[t]; ok {
			return o
		}
	}
	k.obsMu.Lock()
	defer k.obsMu.Unlock()
	old := k.observers.Load()
	if old != nil {
		if o, ok := (*old)[t]; ok {
			return o
		}
	}
	o := k.handle.WithLabelValues(k.name, messageName(t))
	m := make(map[reflect.Type]prometheus.Observer, 1+lenOf(old))
	if old != nil {
		for t, o := range *old {
			m[t] = o
		}
	}
	m[t] = o
	k.observers.Store(&m)
	return o
}

func lenOf(m *map[reflect.Type]prometheus.Observer) int {
	if m == nil {
		return 0
	}
	return len(*m)
}

// messageName is the message label for a message type: the Go type name
// without package path or pointer stars ("Pick", "Started"). Unnamed types
// use their type literal ("[]uint8"); a nil message is "nil".
func messageName(t reflect.Type) string {
	if t == nil {
		return "nil"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n := t.Name(); n != "" {
		return n
	}
	return t.String()
}

// mailboxCollector exports the scrape-time gauges of every kind that has
// been given Options: mailbox length and live actors.
type mailboxCollector Metrics

func (c *mailboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.mailboxDesc
	ch <- c.actorsDesc
}

func (c *mailboxCollector) Collect(ch chan<- prometheus.Metric) {
	for _, k := range (*Metrics)(c).kindList() {
		queued, live := k.sample()
		ch <- prometheus.MustNewConstMetric(c.mailboxDesc, prometheus.GaugeValue, float64(queued), k.name)
		ch <- prometheus.MustNewConstMetric(c.actorsDesc, prometheus.GaugeValue, float64(live), k.name)
	}
}
