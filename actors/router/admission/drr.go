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
// session can release.
func (q *Queue) WakeCapacity(h Host) {
	for _, c := range q.classes {
		for l := range c.held {
			if !l.sessionOnly {
				q.ready(l)
			}
		}
	}
	q.Pump(h)
}

// Pump dispatches heads by deficit round robin across classes (cost 1 per request, quantum
// requests per round) until no head can go. The class that still has credit after a dispatch
// is tried first next time without new credit; a class whose head cannot go keeps its credit
// and earns none; an empty class's credit resets. A head that cannot go blocks only its lane.
//
// It terminates by construction: every head asked either dispatches (one request fewer) or
// parks its lane where this pump does not look again — held, or in a capacity group marked
// full for the rest of the pump (loads only rise within a pump). So one pump asks at most
// (requests dispatched + lanes + capacity groups) heads.
func (q *Queue) Pump(h Host) {
	n := len(q.classes)
	if n == 0 {
		return
	}
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
			continue
		}
		c.deficit--
		q.pop(e)
		q.dispatched(e, w)
		q.cursor = (c.index + 1) % n
		q.carry = nil
		if c.queued == 0 {
			c.deficit = 0
		} else if c.deficit > 0 {
			q.carry = c
		}
	}
}

// popNext chooses the class and head to dispatch next, crediting the class as DRR says.
func (q *Queue) popNext(h Host) (*class, *Entry, string) {
	if c := q.carry; c != nil {
		if e, t := q.nextHead(c, h); e != nil {
			return c, e, t
		}
	}
	n := len(q.classes)
	for k := range n {
		c := q.classes[(q.cursor+k)%n]
		if c.queued == 0 {
			c.deficit = 0
			continue
		}
		e, t := q.nextHead(c, h)
		if e == nil {
			continue // blocked: keeps its credit, earns none
		}
		if c.deficit < 1 {
			c.deficit += c.cfg.Quantum
		}
		return c, e, t
	}
	return nil, nil, ""
}

// nextHead returns the oldest dispatchable head of c — from its ready lanes, or from the
// capacity groups not yet found full in this pump — parking the lanes whose heads cannot go.
func (q *Queue) nextHead(c *class, h Host) (*Entry, string) {
	for {
		var l *lane
		if c.ready.Len() > 0 {
			l = c.ready[0]
		}
		for _, g := range c.groups {
			if g.full != q.pump && (l == nil || g.lanes[0].head().seq < l.head().seq) {
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
	}
}
