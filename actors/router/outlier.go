package router

import (
	"time"

	"github.com/tlgw/tlgw/internal/clock"
)

// Outlier ejection (R14.2). The worker actors count failure streaks from their Releases and
// ask for an ejection in a LoadReport; the router decides, because only it sees a model's
// other workers. An ejected worker leaves its pool (it is not routable whatever its heartbeats
// say) until its ejection ends on the clock.
//
// Decisions written down here:
//   - The n-th ejection in a run lasts base × 2^(n−1), at most max_ejection. A run ends when
//     the worker has served max_ejection without an ejection since the last one ended: the
//     next ejection is the first again.
//   - Ejecting a worker must keep both caps: the model's ejected workers (this one included)
//     at most max_ejected_percent of its live workers, and at least one other routable worker
//     of the model. A request refused by a cap is logged and changes nothing: the worker's
//     next full streak asks again.
//   - The ejection belongs to the worker's registration: a worker evicted and registered again
//     starts afresh.
//   - A worker whose address refused a connection (unreachable, R19) is out of routing by
//     that alone and counts on neither side of max_ejected_percent: the cap is over the
//     model's live workers that are not unreachable, and only those of them ejected count.
//     So provably dead engines leave the cap to the ones that fail while they answer.

// ejection is one slot's outlier state.
type ejection struct {
	on     bool
	until  time.Time
	reason Outcome
	seq    uint64      // the ejection in force (ejectionOver names it)
	runs   int         // ejections in the current run
	ended  time.Time   // when the last ejection ended (zero: never ejected)
	timer  clock.Timer // ends the ejection in force; stopped when the worker leaves (remove)
}

func (e *ejection) stop() {
	if e.timer != nil {
		e.timer.Stop()
		e.timer = nil
	}
}

// ejectionOver is the end of an ejection, on the clock.
type ejectionOver struct {
	id  string
	seq uint64
}

// ejectionFor is the length of the n-th ejection of a run (n ≥ 1). The doubling stops at
// limit without passing it: a max_ejection above half the longest time.Duration (a config may
// give one) would otherwise overflow into a negative length.
func (v *workerView) ejectionFor(n int) time.Duration {
	d, limit := v.outlier.BaseEjection, v.outlier.MaxEjection
	for i := 1; i < n && d < limit; i++ {
		if d > limit-d {
			d = limit
		} else {
			d *= 2
		}
	}
	return min(d, limit)
}

// eject takes worker id out of routing for reason, if the caps allow; it reports whether it did.
func (v *workerView) eject(id string, reason Outcome, fx effects) bool {
	s := v.slots[id]
	if s == nil || !s.live || s.ej.on || !reason.Failed() || v.outlier.BaseEjection <= 0 {
		return false
	}
	// The caps count the workers that can stand in for s: the model's workers of its role (a
	// decode worker cannot prefill, so a disaggregated model keeps a routable prefill worker
	// however many decode and unified workers it has).
	live, ejected, others := 0, 0, 0
	for _, o := range v.slots {
		if !o.live || o.info.Model != s.info.Model || o.info.Role != s.info.Role || (o.unreachable && o != s) {
			continue
		}
		live++
		if o.ej.on {
			ejected++
		}
		if o != s && o.routable() {
			others++
		}
	}
	if float64(ejected+1)*100 > v.outlier.MaxEjectedPercent*float64(live) || others == 0 {
		return false
	}
	now := v.clk.Now()
	if !s.ej.ended.IsZero() && now.Sub(s.ej.ended) >= v.outlier.MaxEjection {
		s.ej.runs = 0 // served a whole max_ejection since the last one: a new run
	}
	s.ej.runs++
	d := v.ejectionFor(s.ej.runs)
	v.ejectSeq++
	s.ej.on, s.ej.until, s.ej.reason, s.ej.seq = true, now.Add(d), reason, v.ejectSeq
	s.ej.timer = fx.after(d, ejectionOver{id: id, seq: v.ejectSeq})
	v.leavePool(s)
	v.setState(s, s.stateName())
	if v.ejections != nil {
		v.ejections.WithLabelValues(reason.String()).Inc()
	}
	return true
}

// ejectionOver puts an ejected worker back; it reports whether it rejoined a pool (a wake for
// the admission queue).
func (v *workerView) ejectionOver(m ejectionOver) bool {
	s := v.slots[m.id]
	if s == nil || !s.ej.on || s.ej.seq != m.seq {
		return false // a stale end: the worker left, or was ejected again since
	}
	s.ej.on, s.ej.until, s.ej.reason, s.ej.timer = false, time.Time{}, OutcomeNone, nil
	s.ej.ended = v.clk.Now()
	v.joinPool(s)
	return s.pool != nil
}
