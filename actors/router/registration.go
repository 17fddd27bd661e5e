package router

// Registrations. A worker id can be registered, evicted and registered again (its engine
// restarted, maybe elsewhere, on other hardware); the registry numbers each registration
// (WorkerInfo.Reg) and every message about a worker names the one it is about: the worker
// actor's WorkerState and LoadReport, the request actor's ObservedTTFT and WarmupSent (from the
// Picked that named the registration) and the KvEvents subscriber's KVEvents (opened for one
// registration, R18.3). Messages of one registration and of the next come from different
// actors or goroutines, so the router's mailbox does not order them: an old actor's last
// report, a measurement of an attempt on the old engine or an event of the old engine's
// stream can arrive after the new registration's first WorkerState. The router applies each
// only to the registration it names (registered), and a WorkerState of an earlier registration
// than the one it holds changes nothing (workerState).
//
// A message of the current registration that arrives before its WorkerState: the worker actor
// sends its WorkerState first, and one actor's messages to the router stay in order, so its
// LoadReports cannot; ObservedTTFT and WarmupSent name a registration from a pick, which only
// registrations the router holds get. A KvEvents stream is opened by the registry's goroutine
// when the heartbeat is accepted, so its handshake can come first: it is refused like any
// message of a registration the router does not hold, and the subscriber retries it after a
// backoff, so the index starts from a snapshot taken once the router knows the registration.
// Nothing waits in the router for a registration it does not know.

// registered returns the slot of worker id while its registration is reg, else nil (the router
// holds another registration of id, or none).
func (v *workerView) registered(id string, reg uint64) *slot {
	if s := v.slots[id]; s != nil && s.info.Reg == reg {
		return s
	}
	return nil
}
