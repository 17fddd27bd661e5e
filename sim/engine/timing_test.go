package engine

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/clock"
	"github.com/tlgw/tlgw/internal/gwtest"
	"github.com/tlgw/tlgw/sim/sampler"
)

// TestPrefillCostsUncachedTokens: prefill waits PrefillPerToken per uncached prompt token on the
// engine's clock; a repeat of the prompt pays only for what the prefix cache lacks.
func TestPrefillCostsUncachedTokens(t *testing.T) {
	prompt := "the" + strings.Repeat(" the", 39)
	if n := len(sampler.Tokenize(prompt)); n != 40 {
		t.Fatalf("the prompt has %d tokens, want 40", n)
	}
	fc := clock.NewFake(time.Unix(0, 0))
	e := start(t, Config{PrefillPerToken: time.Second, Clock: fc})
	body := `{"model":"smol","prompt":"` + prompt + `","max_tokens":1,"seed":1}`
	send := func() chan int {
		done := make(chan int, 1)
		go func() {
			resp, err := http.Post("http://"+e.HTTPAddr+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				done <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			done <- resp.StatusCode
		}()
		return done
	}
	// Cold: 40 uncached tokens = 40 s. The timer has not fired at 39 s, it fires at 40 s.
	done := send()
	gwtest.Eventually(t, "prefill timer armed", func() bool { return fc.Pending() == 1 })
	fc.Advance(39 * time.Second)
	if fc.Pending() != 1 {
		t.Fatal("prefill finished before 40 uncached tokens' cost")
	}
	fc.Advance(time.Second)
	if code := <-done; code != 200 {
		t.Fatalf("status %d", code)
	}
	// Warm: two full 16-token blocks are cached, 8 tokens remain: 8 s.
	done = send()
	gwtest.Eventually(t, "prefill timer armed", func() bool { return fc.Pending() == 1 })
	fc.Advance(7 * time.Second)
	if fc.Pending() != 1 {
		t.Fatal("warm prefill finished before 8 tokens' cost")
	}
	fc.Advance(time.Second)
	if code := <-done; code != 200 {
		t.Fatalf("status %d", code)
	}
	if st := e.sched.status(); st.kv.HitTokens != 32 || st.kv.LookupTokens != 80 {
		t.Fatalf("hit %d of %d looked-up tokens, want 32 of 80", st.kv.HitTokens, st.kv.LookupTokens)
	}
}
