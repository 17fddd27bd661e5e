package admission

// Wake asks every held head again and dispatches what it can: called when a worker arrives,
// leaves or drains, and on the gate's periodic recheck.
func (q *Queue) Wake(h Host) {
	for _, c := range q.classes {
		for l := range c.held {
			q.ready(l)
		}
	}
	q.Pump(h)
}

// WakeCapacity is a capacity free (a request finished, a worker's load fell): capacity-blocked
// heads are asked again, oldest first, one per candidate set until that set is full again, and
// so are held heads — a gate may hold for room (GATE-PITFALLS 8) — except those only their
// session can release (and, of those the gate names when it lets them go, one per candidate
// set: see WakeCapacityFor).
func (q *Queue) WakeCapacity(h Host) {
	q.WakeCapacityFor(h, nil)
}

// WakeCapacityFor is a capacity free that only some heads can use (one worker's load fell):
// as WakeCapacity, but only the held lanes and the capacity groups whose head serves reports
// true are asked again — a head that cannot be sent to the freed worker would get the answer
// it got (a gate sees only the head's candidates, and nothing but their loads changed). The
// lanes already ready are asked as always. serves must not depend on a request's own
// exclusions: a capacity group's head answers for every lane of its candidate set.
//
// Of the heads held until the gate names them (Decision.GateWakes), only the oldest of each
// class and candidate set is asked: its ask lets the gate settle, and the gate names every
// head it lets go then (Waker), each asked in the same pump.
func (q *Queue) WakeCapacityFor(h Host, serves func(*Entry) bool) {
	for _, c := range q.classes {
		for l := range c.held {
			switch {
			case l.sessionOnly || serves != nil && !serves(l.head()):
			case l.gateWakes:
				if p := q.probes[l.head().capKey]; p == nil || c.before(l.head(), p.head()) {
					q.probes[l.head().capKey] = l
				}
			default:
				q.ready(l)
			}
		}
		for _, l := range q.probes {
			q.ready(l)
		}
		clear(q.probes)
		if serves == nil {
			continue
		}
		for _, g := range c.groups {
			if !serves(g.lanes[0].head()) {
				g.full = q.pump + 1 // skipped by the pump below, as if found full in it
			}
		}
	}
	q.Pump(h)
}

// Pump dispatches heads until no head can go: the highest priority tier that has a head that
// can go is served first (R15.2), and the classes of a tier share by deficit round robin —
// a dispatch costs its class one (cost = requests) or the request's estimated uncached prompt
// tokens and the most it may generate (cost = uncached_tokens), and a class earns its quantum
// per visit of the ring. The class that still has credit after a dispatch is tried first next
// time without new credit; a class whose head cannot go keeps its credit and earns none; an
// empty class's credit resets.
// A head that cannot go blocks only its lane.
//
// It terminates by construction: every head asked either dispatches (one request fewer) or
// parks its lane where this pump does not look again — held, or in a capacity group marked
// full for the rest of the pump (loads only rise within a pump) — and one choice asks each
// class's head once. So one pump asks at most (requests dispatched × classes + lanes +
// capacity groups) heads.
func (q *Queue) Pump(h Host) {
	if len(q.classes) == 0 {
		return
	}
	for {
		q.pumpOnce(h)
		if len(q.failed) == 0 {
			return
		}
		q.failHeads(h) // may expose heads: pump again (each round removes at least one entry)
	}
}

// failHeads answers the heads the gate failed on (R15.3) and takes them out of their lanes.
func (q *Queue) failHeads(h Host) {
	failed := q.failed
	q.failed = nil
	for _, e := range failed {
		if e.Queued() {
			q.remove(e)
		}
		e.state = left
		h.Reject(e, ErrClassifierFailed)
	}
}

func (q *Queue) pumpOnce(h Host) {
	q.pump++
	for {
		c, e, target := q.popNext(h)
		if e == nil {
			return
		}
		w, ok := h.Dispatch(e, target)
		if !ok {
			// The host found no room although the view showed some: the set is full for
			// this pump.
			e.wait = WaitCapacity
			q.block(e.lane, e, h)
			e.lane.group.full = q.pump
			q.lateFailed(e)
			continue
		}
		t := c.tier
		c.deficit = max(0, c.deficit-c.cost(e))
		q.pop(e)
		q.dispatched(e, w)
		t.cursor = (c.index + 1) % len(t.classes)
		t.carry = nil
		if c.queued == 0 {
			c.deficit = 0
		} else if c.deficit > 0 {
			t.carry = c
		}
	}
}

// popNext chooses the class and head to dispatch next: from the highest tier that has a head
// that can go.
func (q *Queue) popNext(h Host) (*class, *Entry, string) {
	for _, t := range q.tiers {
		if c, e, target := q.popTier(t, h); e != nil {
			return c, e, target
		}
	}
	return nil, nil, ""
}

// candidate is a class's head that can go, found in one choice.
type candidate struct {
	c      *class
	e      *Entry
	target string
}

// popTier chooses within one tier by deficit round robin, crediting classes as it goes: the
// carried class first without new credit; then the ring from the cursor, where a class whose
// head's cost its credit covers goes, and one that is short earns a quantum and goes if that
// covers it. If no head is covered after a full ring, every class with a head that can go
// earns the fewest whole rounds of quanta that cover one of them, at once (an oversized head
// never waits ring after ring), and the first covered in ring order goes. Each class's head
// is asked once per choice.
func (q *Queue) popTier(t *tier, h Host) (*class, *Entry, string) {
	var carried candidate
	if c := t.carry; c != nil {
		if e, target := q.nextHead(c, h); e != nil {
			if c.cost(e) <= c.deficit {
				return c, e, target
			}
			carried = candidate{c, e, target}
		}
	}
	n := len(t.classes)
	var short []candidate // heads that can go but are not yet covered, in ring order
	for k := range n {
		c := t.classes[(t.cursor+k)%n]
		if c.queued == 0 {
			c.deficit = 0
			continue
		}
		var e *Entry
		var target string
		if c == carried.c {
			e, target = carried.e, carried.target
		} else if c != t.carry {
			e, target = q.nextHead(c, h)
		}
		if e == nil {
			continue // blocked: keeps its credit, earns none
		}
		if cost := c.cost(e); cost > c.deficit {
			c.deficit += c.cfg.Quantum
			if cost > c.deficit {
				short = append(short, candidate{c, e, target})
				continue
			}
		}
		return c, e, target
	}
	if len(short) == 0 {
		return nil, nil, ""
	}
	rounds := -1
	for _, s := range short {
		need := (s.c.cost(s.e) - s.c.deficit + s.c.cfg.Quantum - 1) / s.c.cfg.Quantum
		if rounds < 0 || need < rounds {
			rounds = need
		}
	}
	for _, s := range short {
		s.c.deficit += rounds * s.c.cfg.Quantum
	}
	for _, s := range short {
		if s.c.cost(s.e) <= s.c.deficit {
			return s.c, s.e, s.target
		}
	}
	return nil, nil, "" // unreachable: the rounds cover at least one
}

// nextHead returns the first dispatchable head of c in its order — from its ready lanes, or from the
// capacity groups not yet found full in this pump — parking the lanes whose heads cannot go.
func (q *Queue) nextHead(c *class, h Host) (*Entry, string) {
	for {
		var l *lane
		if c.ready.Len() > 0 {
			l = c.ready[0]
		}
		for _, g := range c.groups {
			if g.full != q.pump && !(g.objective && q.lateDone()) && (l == nil || c.before(g.lanes[0].head(), l.head())) {
				l = g.lanes[0]
			}
		}
		if l == nil {
			return nil, ""
		}
		e := l.head()
		d, ok := q.ask(e, h)
		if ok {
			return e, d.Target
		}
		if !e.wait.blocksOnCapacity() {
			q.block(l, e, h) // held by the gate
			continue
		}
		if l.where != inCapWait || l.group.key != e.capKey {
			q.block(l, e, h)
		}
		l.group.full = q.pump // every head of this candidate set would find the same
		q.lateFailed(e)
	}
}
