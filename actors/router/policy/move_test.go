package policy

import "testing"

// TestMemberMovesBetweenPolicies: the router keeps one Member per worker for its whole life
// and moves it from pool to pool (a worker whose role or model changes, a prefill pool's
// least_outstanding to a decode pool's route policy): a member removed from a policy of any
// kind joins a policy of any other kind as a fresh one would, is counted and picked there.
func TestMemberMovesBetweenPolicies(t *testing.T) {
	for _, from := range Names() {
		for _, to := range Names() {
			src, _ := New(from, Options{})
			dst, _ := New(to, Options{})
			m, stay := &Member{ID: "m"}, &Member{ID: "s"}
			src.Add(stay, 0, 1)
			src.Add(m, 0, 1) // not the only member: its place is not the first
			src.Remove(m)
			dst.Add(m, 0, 1)
			if dst.Len() != 1 {
				t.Fatalf("%s → %s: %d members after the move, want 1", from, to, dst.Len())
			}
			if got, _ := dst.Pick(0, nil); got != m {
				t.Fatalf("%s → %s: picked %v after the move, want m", from, to, got)
			}
			if got, _ := src.Pick(0, nil); got != stay || src.Len() != 1 {
				t.Fatalf("%s → %s: the old pool picked %v (len %d), want s alone", from, to, got, src.Len())
			}
		}
	}
}
