package router

import (
	"fmt"
	"testing"
	"time"

	"github.com/tlgw/tlgw/actors/router/admission/sessionserial"
	"github.com/tlgw/tlgw/internal/config"
)

// routerTables is what the router keeps, table by table (R19).
type routerTables struct {
	entries, queued, slots, byPID, pools, models, routable, pidxWorkers, pidxEntries, kidxWorkers, kidxEntries, warming int
}

func tablesOf(st *state) routerTables {
	v := st.view
	out := routerTables{slots: len(v.slots), byPID: len(v.byPID), pools: len(v.pools), models: len(v.models),
		routable: v.routable}
	if st.adm != nil {
		out.entries, out.queued = len(st.adm.entries), st.adm.q.Len()
	}
	if v.pidx != nil {
		out.pidxWorkers, out.pidxEntries = v.pidx.Workers(), v.pidx.Entries()
	}
	if v.kidx != nil {
		out.kidxWorkers, out.kidxEntries = v.kidx.Workers(), v.kidx.Entries()
	}
	for _, c := range v.warming {
		if c.target != nil {
			out.warming++
		}
	}
	return out
}

// TestRouterTablesEmptyAfterRequests (R19): after n admitted requests — answered at once,
// queued and dispatched later, queued and left, queued and timed out, with and without a
// session and prompt hashes — have ended, the router keeps no admitted request, nothing
// queued and no session in its gate's ledger; once the workers have gone it keeps no slot, pool,
// model or prefix-index entry either.
func TestRouterTablesEmptyAfterRequests(t *testing.T) {
	for _, policyName := range []string{"least_outstanding", config.PolicyPrecisePrefix} {
		t.Run(policyName, func(t *testing.T) { testRouterTablesEmpty(t, policyName) })
	}
}

func testRouterTablesEmpty(t *testing.T, policyName string) {
	gate := sessionserial.New()
	r := newRig(t, Config{Policy: policyName, Admission: admissionCfg(gate, 2), PrefixIndexBlocks: 256})
	const workers, n = 4, 600
	ids := make([]string, workers)
	for i := range ids {
		ids[i] = fmt.Sprint("w", i)
		r.joinWith(ids[i], "m", RoleUnified, 0, func(w *WorkerInfo) { w.KVEvents = true })
		if r.st.view.kidx != nil {
			r.deliver(nil, &KVEvents{WorkerID: ids[i], Reg: r.regOf(ids[i]), Stored: longPrompt(ids[i], 4)})
		}
	}
	var live []*requester
	var waited, timedOut int
	end := func(q *requester) {
		for _, a := range q.answers() {
			switch a := a.(type) {
			case *Queued:
				waited++
			case *Picked:
				if a.Err != nil {
					timedOut++
				}
			}
		}
		q.stop()
	}
	for i := range n {
		q := r.newRequester()
		admit := AdmitInfo{PromptTokens: 100}
		if i%3 == 0 {
			admit.SessionID = fmt.Sprint("s", i%11)
		}
		q.tag++
		r.deliver(q.pid, &Pick{Model: "m", RequestID: fmt.Sprint("r", i), Key: q.key, Requester: q.pid, Tag: q.tag,
			PrefixHashes: longPrompt(fmt.Sprint("prompt ", i%5), 3), Admit: &admit})
		live = append(live, q)
		switch {
		case i%50 == 49:
			r.advance(31 * time.Second) // the queued ones time out (max_wait 30 s)
		case len(live) > 12:
			// The oldest end: answered, or a client that leaves while queued.
			end(live[0])
			live = live[1:]
		}
	}
	for _, q := range live {
		end(q)
	}
	r.advance(31 * time.Second)
	if waited == 0 || timedOut == 0 {
		t.Fatalf("of %d requests %d waited and %d timed out: the run must queue and expire some", n, waited, timedOut)
	}
	got := tablesOf(r.st)
	if got.entries != 0 || got.queued != 0 || gate.Tracked() != 0 {
		t.Fatalf("after %d requests ended: %d admitted, %d queued, %d in the gate's ledger", n, got.entries, got.queued, gate.Tracked())
	}
	if got.slots != workers || got.pools != 1 || got.models != 1 || got.pidxWorkers > workers || got.pidxEntries == 0 ||
		(r.st.view.kidx != nil && got.kidxEntries == 0) {
		t.Fatalf("with %d workers live: %+v", workers, got)
	}
	for _, id := range ids {
		r.leave(id)
	}
	r.advance(warmPending)
	if got := tablesOf(r.st); got != (routerTables{}) {
		t.Fatalf("after every worker left: %+v", got)
	}
}
