package worker

import (
	"testing"

	"github.com/tlgw/tlgw/actors/router"
)

// TestJudgeCountsFailureStreaks: consecutive failures up to consecutive_failures ask for an
// ejection with the last failure and start the streak again; a success resets it; OutcomeNone
// and values that are no outcome change nothing; 0 turns it off.
func TestJudgeCountsFailureStreaks(t *testing.T) {
	st := &state{cfg: Config{ConsecutiveFailures: 3}}
	steps := []struct {
		in, want router.Outcome
		streak   int
	}{
		{router.OutcomeRefused, router.OutcomeNone, 1},
		{router.OutcomeNone, router.OutcomeNone, 1},
		{router.Outcome(99), router.OutcomeNone, 1},
		{router.Outcome5xx, router.OutcomeNone, 2},
		{router.OutcomeSuccess, router.OutcomeNone, 0},
		{router.OutcomeReset, router.OutcomeNone, 1},
		{router.OutcomeTimeout, router.OutcomeNone, 2},
		{router.OutcomeInterrupted, router.OutcomeInterrupted, 0},
		{router.Outcome5xx, router.OutcomeNone, 1},
	}
	for i, s := range steps {
		if got := st.judge(s.in); got != s.want || st.streak != s.streak {
			t.Fatalf("step %d (%v): judged %v with streak %d, want %v and %d", i, s.in, got, st.streak, s.want, s.streak)
		}
	}
	off := &state{}
	for range 10 {
		if got := off.judge(router.Outcome5xx); got != router.OutcomeNone {
			t.Fatalf("ejection off, yet judge asked for one: %v", got)
		}
	}
}
