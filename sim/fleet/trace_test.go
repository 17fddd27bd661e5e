package fleet

import (
	"testing"
)

// TestTraceShapes: every trace keeps to the shape docs/simulate.md gives it.
func TestTraceShapes(t *testing.T) {
	in := func(t *testing.T, what string, n int32, lo, hi int) {
		t.Helper()
		if int(n) < lo || int(n) > hi {
			t.Fatalf("%s of %d tokens, outside [%d, %d]", what, n, lo, hi)
		}
	}
	t.Run("shared-prefix", func(t *testing.T) {
		tr, err := genTrace(TraceSharedPrefix, 3000, 5, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		systems, users := map[uint64]int32{}, map[uint64]bool{}
		for _, q := range tr.reqs {
			if len(q.msgs) != 2 || q.msgs[0].role != roleSystem || q.msgs[1].role != roleUser || q.out.role != roleAssistant {
				t.Fatalf("request %+v", q)
			}
			in(t, "a system prompt", q.msgs[0].n, 2048, 4096)
			in(t, "a user message", q.msgs[1].n, 64, 512)
			in(t, "an answer", q.out.n, 32, 256)
			if n, seen := systems[q.msgs[0].seg]; seen && n != q.msgs[0].n {
				t.Fatalf("system prompt %x with %d and %d tokens", q.msgs[0].seg, n, q.msgs[0].n)
			}
			systems[q.msgs[0].seg] = q.msgs[0].n
			if users[q.msgs[1].seg] {
				t.Fatalf("user message %x twice", q.msgs[1].seg)
			}
			users[q.msgs[1].seg] = true
		}
		if len(systems) != 10 {
			t.Fatalf("%d system prompts for 5 workers, want 2 × 5", len(systems))
		}
	})
	t.Run("no-sharing", func(t *testing.T) {
		tr, err := genTrace(TraceNoSharing, 500, 5, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range tr.reqs {
			if len(q.msgs) != 1 || q.msgs[0].role != roleUser {
				t.Fatalf("request %+v", q)
			}
			in(t, "a prompt", q.msgs[0].n, 512, 3072)
			in(t, "an answer", q.out.n, 32, 256)
		}
	})
	for _, c := range []struct {
		name                               string
		systems, sysLo, sysHi, maxTurns    int
		userLo, userHi, answerLo, answerHi int
		maxContext, requests               int
	}{
		{TraceMultiTurn, 16, 256, 1024, 12, 32, 256, 64, 384, 0, 4000},
		{TraceAgentic, 8, 4096, 8192, 40, 128, 1024, 16, 96, 12288, 40000},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr, err := genTrace(c.name, c.requests, 2, 0, 1)
			if err != nil {
				t.Fatal(err)
			}
			systems := map[uint64]bool{}
			last := map[uint64]request{} // each conversation's latest request, by its first user message
			for _, q := range tr.reqs {
				m := q.msgs
				if len(m)%2 != 0 || m[0].role != roleSystem || len(m)/2 > c.maxTurns {
					t.Fatalf("prompt of %d messages, want system + up to %d turns", len(m), c.maxTurns)
				}
				in(t, "a system prompt", m[0].n, c.sysLo, c.sysHi)
				systems[m[0].seg] = true
				for k := 1; k < len(m); k++ {
					want := roleUser
					lo, hi := c.userLo, c.userHi
					if k%2 == 0 {
						want, lo, hi = roleAssistant, c.answerLo, c.answerHi
					}
					if m[k].role != want {
						t.Fatalf("message %d of %d is %v", k, len(m), m[k].role)
					}
					in(t, "a message", m[k].n, lo, hi)
				}
				in(t, "an answer", q.out.n, c.answerLo, c.answerHi)
				if c.maxContext > 0 && q.promptTokens()+int(q.out.n) > c.maxContext {
					t.Fatalf("%d tokens of context, over %d", q.promptTokens()+int(q.out.n), c.maxContext)
				}
				// A later turn's prompt is the conversation's last prompt and its answer, then
				// the new user message: the conversation grows its own prefix.
				conv := m[1].seg
				if prev, ok := last[conv]; ok {
					if len(m) != len(prev.msgs)+2 || m[len(m)-2] != prev.out {
						t.Fatalf("turn of %d messages after one of %d: not its predecessor's prompt and answer", len(m), len(prev.msgs))
					}
					for k := range prev.msgs {
						if m[k] != prev.msgs[k] {
							t.Fatalf("message %d changed between turns", k)
						}
					}
				} else if len(m) != 2 {
					t.Fatalf("a conversation's first request has %d messages", len(m))
				}
				last[conv] = q
			}
			if len(systems) != c.systems {
				t.Fatalf("%d system prompts, want %d", len(systems), c.systems)
			}
		})
	}
	if _, err := genTrace("bursty", 1, 1, 0, 1); err == nil {
		t.Fatal("an unknown trace was generated")
	}
}
