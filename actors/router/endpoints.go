package router

import (
	"fmt"
	"time"

	"github.com/tlgw/tlgw/internal/errs"
	"github.com/tlgw/tlgw/internal/oai"
)

// Serving endpoints per worker (R21). A worker that lists its endpoints (WorkerInfo.Endpoints)
// gets only requests for those; one that lists none is tried for every endpoint, and an
// engine that answers an endpoint with its server's own 404/405 (the path is not served, which
// is not a failure of the engine) is marked as not serving it for UnsupportedFor. A pick for an
// endpoint skips the members that do not serve it; a pool where every member serves every
// endpoint (the common case) pays one comparison per pick for this.

// UnsupportedFor is how long an engine's 404/405 for an endpoint keeps that endpoint off the
// worker: long enough that a fleet of engines without it is not asked once per request, short
// enough that an engine restarted with the endpoint gets it back within a minute.
const UnsupportedFor = time.Minute

// EndpointUnsupported tells the router that a worker's engine answered an endpoint with its
// HTTP server's own 404 or 405: the worker gets no request for it for UnsupportedFor. Reg is the
// registration the attempt went to; a report about an earlier registration changes nothing.
// No reply.
type EndpointUnsupported struct {
	WorkerID string
	Reg      uint64
	Endpoint oai.Kind
}

// IgnoreDeadLetterLogging: the router may be stopping.
func (*EndpointUnsupported) IgnoreDeadLetterLogging() {}

// endpointMarks are the endpoints a worker's engine refused, each until its time.
type endpointMarks struct {
	until [oai.MaxKind + 1]time.Time
	any   bool // some mark was set and has not been seen expired
}

// restricted reports whether s may not serve some endpoint: it lists endpoints short of all
// (tlengine lists every one), or has marks that may still be in force.
func (s *slot) restricted() bool { return !s.info.Endpoints.Full() || s.marks.any }

// serves reports whether s serves endpoint k at now. Kind 0 (a pick that names no endpoint) is
// served by every worker.
func (s *slot) serves(k oai.Kind, now time.Time) bool {
	if k == 0 {
		return true
	}
	if !s.info.Endpoints.Serves(k) {
		return false
	}
	return !s.marks.any || !now.Before(s.marks.until[k])
}

// expireMarks clears the marks flag once every mark has passed; it reports whether it did.
func (s *slot) expireMarks(now time.Time) bool {
	if !s.marks.any {
		return false
	}
	for _, t := range s.marks.until {
		if now.Before(t) {
			return false
		}
	}
	s.marks = endpointMarks{}
	return true
}

// countRestricted keeps pl.restricted, the members that may not serve some endpoint, in step
// with member s (slot.restrictedIn says whether s is counted).
func (pl *pool) countRestricted(s *slot) {
	if r := s.restricted(); r != s.restrictedIn {
		s.restrictedIn = r
		if r {
			pl.restricted++
		} else {
			pl.restricted--
		}
	}
}

// endpointUnsupported marks a worker as not serving an endpoint (EndpointUnsupported).
func (v *workerView) endpointUnsupported(m *EndpointUnsupported) {
	s := v.registered(m.WorkerID, m.Reg)
	if s == nil || !m.Endpoint.Valid() {
		return
	}
	s.marks.until[m.Endpoint] = v.clk.Now().Add(UnsupportedFor)
	s.marks.any = true
	if s.pool != nil {
		s.pool.countRestricted(s)
	}
}

// endpointExclude is exclude plus the members of pl that do not serve endpoint k (a new slice
// only when some member is restricted), and how many members serve it.
func (v *workerView) endpointExclude(pl *pool, k oai.Kind, exclude []string) ([]string, int) {
	if k == 0 || pl.restricted == 0 {
		return exclude, len(pl.members)
	}
	now := v.clk.Now()
	out := append([]string(nil), exclude...)
	serving := 0
	for _, id := range pl.memberIDs() {
		s := pl.members[id]
		if s.expireMarks(now) {
			pl.countRestricted(s)
		}
		if s.serves(k, now) {
			serving++
		} else {
			out = append(out, id)
		}
	}
	return out, serving
}

// unserved is a pick's error when no worker of model serves endpoint k: a 404 that says so.
func unserved(model string, k oai.Kind) error {
	return fmt.Errorf("no worker of model %q serves %s: %w", model, k.Path(), errs.ErrNotFound)
}
