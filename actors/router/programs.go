package router

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/actors/router/admission/thunderagent"
)

// programLister is the optional admission policy interface of a classifier that keeps agent
// programs (SPEC R15.1): the admin list and the counts behind the program metrics. Only
// thunderagent has one; the admitter asks for it once, at start.
type programLister interface {
	Programs() []thunderagent.ProgramView
	Stats() thunderagent.Stats
}

var _ programLister = (*thunderagent.Policy)(nil)

// programStates are the states of tlgw_programs, in the order of programTracker.gauges.
var programStates = [3]string{thunderagent.StateReasoning, thunderagent.StateActing, thunderagent.StatePaused}

// programTracker is the admitter's view of a policy that keeps programs: its list for the
// admin API and its metrics, refreshed with the queue-length gauges after each admission event.
type programTracker struct {
	l      programLister
	gauges [3]prometheus.Gauge // in programStates' order
	m      *admissionMetrics
	// The policy's counts at the last refresh: the counters advance by the difference (the
	// policy's counts only grow).
	pauses, forced uint64
}

// newProgramTracker returns nil when pol keeps no programs: the admitter then pays nothing.
func newProgramTracker(pol admission.Policy, m *admissionMetrics) *programTracker {
	l, ok := pol.(programLister)
	if !ok {
		return nil
	}
	p := &programTracker{l: l, m: m}
	for i, s := range programStates {
		p.gauges[i] = m.programs.WithLabelValues(s)
	}
	return p
}

// refresh sets the gauges and advances the counters from the policy's Stats (which walks
// every program: so it runs only for a programLister).
func (p *programTracker) refresh() {
	s := p.l.Stats()
	p.gauges[0].Set(float64(s.Reasoning))
	p.gauges[1].Set(float64(s.Acting))
	p.gauges[2].Set(float64(s.Paused))
	if s.Pauses > p.pauses {
		p.m.programPauses.Add(float64(s.Pauses - p.pauses))
	}
	if s.ForcedResumes > p.forced {
		p.m.programForcedResumes.Add(float64(s.ForcedResumes - p.forced))
	}
	p.pauses, p.forced = max(p.pauses, s.Pauses), max(p.forced, s.ForcedResumes)
}

// programList answers GetPrograms: the policy's programs, an empty list when it keeps none
// (or admission is off).
func (a *admitter) programList() *ProgramList {
	out := &ProgramList{Programs: []thunderagent.ProgramView{}}
	if a == nil {
		return out
	}
	out.Classifier = a.policy
	if a.progs != nil {
		out.Tracks = true
		if ps := a.progs.l.Programs(); ps != nil {
			out.Programs = ps
		}
	}
	return out
}
