package fleet

import (
	"slices"
	"testing"

	"github.com/tlgw/tlgw/internal/oai"
)

// TestWarmupsCutTheSpillTail: on the shared-prefix trace at 0.8, the prefix policies' tail is
// the requests that spill from a long prompt's holders, all at the cap, to a worker that holds
// nothing. With warm-ups on (the config's default) the router copies such a prompt ahead of
// the spill: both policies run warm-ups, every one of them ends (Run checks that every ticket
// was released and every engine is idle), and the TTFT p99 falls.
func TestWarmupsCutTheSpillTail(t *testing.T) {
	run := func(warm int) *Report {
		t.Helper()
		rep, err := Run(Options{Trace: TraceSharedPrefix, Workers: 40, Requests: 4000, Load: 0.8, Seed: 1,
			Policies: []string{"prefix_aware", "precise_prefix", "least_outstanding"}, WarmupMinBytes: warm})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("prefix_warmup_min_bytes %d:\n%s", warm, markdownOf(t, rep))
		return rep
	}
	off, on := run(-1), run(0)
	for i, pol := range []string{"prefix_aware", "precise_prefix"} {
		a, b := off.Results[i], on.Results[i]
		if a.Warmups != 0 || b.Warmups == 0 {
			t.Errorf("%s: %d warm-ups off, %d on", pol, a.Warmups, b.Warmups)
		}
		if b.Completed != b.Requests || b.TTFTP99Ms >= a.TTFTP99Ms {
			t.Errorf("%s: p99 %.1f ms with warm-ups, %.1f without (%d/%d completed)", pol, b.TTFTP99Ms, a.TTFTP99Ms, b.Completed, b.Requests)
		}
	}
	if lo := on.Results[2]; lo.Warmups != 0 {
		t.Errorf("least_outstanding ran %d warm-ups", lo.Warmups)
	}
}

// TestWarmTokens: a warm-up's prompt is the tokens that lie wholly within its bytes of the
// rendered prompt ("role\n", 4 bytes a token, "\n" per message), and a chat body of the
// messages those tokens make renders as a prefix of the request's render.
func TestWarmTokens(t *testing.T) {
	sys := message{role: roleSystem, seg: segID(segSystem, 1, 0), n: 40}
	user := message{role: roleUser, seg: segID(segUser, 2, 0), n: 10}
	msgs := []message{sys, user}
	all := appendTokens(appendTokens(nil, 7, sys), 7, user)
	// "system\n" is 7 bytes, then token k ends at byte 7 + 4(k+1); the system message's render
	// ends at 7 + 160 + 1 = 168, then "user\n" (5 bytes) and the user's tokens.
	for n, want := range map[int]int{0: 0, 7: 0, 10: 0, 11: 1, 14: 1, 15: 2, 167: 40, 168: 40, 173: 40, 177: 41, 1000: 50} {
		got := warmTokens(nil, 7, msgs, n)
		if len(got) != want || !slices.Equal(got, all[:want]) {
			t.Errorf("within %d bytes: %d tokens, want the first %d", n, len(got), want)
		}
	}
	body := chatBody(nil, 7, msgs, true)
	full := oai.RenderPrompt(oai.Chat, body, len(body))
	if len(full) != 168+5+40+1 {
		t.Fatalf("render of %d bytes", len(full))
	}
}
