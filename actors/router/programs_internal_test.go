package router

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tlgw/tlgw/actors/router/admission/thunderagent"
)

// statsLister is a programLister whose counts the test sets.
type statsLister struct{ s thunderagent.Stats }

func (l *statsLister) Programs() []thunderagent.ProgramView { return nil }
func (l *statsLister) Stats() thunderagent.Stats            { return l.s }

// TestProgramTrackerFollowsTheCounts: the program gauges take the policy's counts; the
// pause and forced-resume counters advance by what the policy's totals grew since the last
// refresh, so they equal those totals however the refreshes fall.
func TestProgramTrackerFollowsTheCounts(t *testing.T) {
	m := newAdmissionMetrics()
	l := &statsLister{}
	p := &programTracker{l: l, m: &m}
	for i, s := range programStates {
		p.gauges[i] = m.programs.WithLabelValues(s)
	}
	for _, s := range []thunderagent.Stats{
		{Reasoning: 3, Acting: 1, Paused: 2, Pauses: 2, ForcedResumes: 1},
		{Reasoning: 0, Acting: 4, Paused: 0, Pauses: 2, ForcedResumes: 1},
		{Reasoning: 1, Acting: 0, Paused: 5, Pauses: 7, ForcedResumes: 4},
		{Reasoning: 1, Acting: 0, Paused: 5, Pauses: 10, ForcedResumes: 9},
	} {
		l.s = s
		p.refresh()
		for i, want := range []int{s.Reasoning, s.Acting, s.Paused} {
			if got := testutil.ToFloat64(m.programs.WithLabelValues(programStates[i])); got != float64(want) {
				t.Fatalf("after %+v: tlgw_programs{state=%q} = %v, want %d", s, programStates[i], got, want)
			}
		}
		if got := testutil.ToFloat64(m.programPauses); got != float64(s.Pauses) {
			t.Fatalf("after %+v: pauses counter %v", s, got)
		}
		if got := testutil.ToFloat64(m.programForcedResumes); got != float64(s.ForcedResumes) {
			t.Fatalf("after %+v: forced resumes counter %v", s, got)
		}
	}
}
