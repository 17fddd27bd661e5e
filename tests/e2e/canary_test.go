package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// TestClientCannotChooseTheCanary (R20, issue 35: the canary split hashed the client's
// X-Request-ID with a public hash, so a client could pick its backend): a route sends 1% of
// requests to smol-v4. An attacker who knows the public draw (the top 53 bits of xxHash64 of
// the id) sends 100 requests with ids it drew ≥ 0.99; before, every one landed on the canary.
// With the keyed draw they land as any ids do (≈ 1%), and each id sent twice lands on one
// backend.
func TestClientCannotChooseTheCanary(t *testing.T) {
	f := startFleetWithKey(t, "sk-ops", fastHeartbeats+`
[[gateway.routes]]
model = "smol"
backends = [{ model = "smol-v3", weight = 0.99 }, { model = "smol-v4", weight = 0.01 }]

[[auth.keys]]
key = "sk-ops"
scopes = ["inference", "admin", "debug"]
`, []string{"e-v3", "--model", "smol-v3"}, []string{"e-v4", "--model", "smol-v4"})

	send := func(id string) string {
		t.Helper()
		req, _ := http.NewRequest("POST", f.base+"/v1/completions", strings.NewReader(`{"model":"smol","prompt":"x","max_tokens":1}`))
		req.Header.Set("Authorization", "Bearer sk-ops")
		req.Header.Set("X-Request-ID", id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %s: %d", id, resp.StatusCode)
		}
		return resp.Header.Get("X-TL-Route")
	}
	var chosen []string
	for i := 0; len(chosen) < 100 && i < 1_000_000; i++ {
		id := fmt.Sprintf("pick-%d", i)
		if float64(xxhash.Sum64String(id)>>11)/(1<<53) >= 0.99 {
			chosen = append(chosen, id)
		}
	}
	canary := 0
	for _, id := range chosen {
		first := send(id)
		if again := send(id); again != first {
			t.Fatalf("id %s went to %s, then to %s", id, first, again)
		}
		if strings.Contains(first, "e-v4") {
			canary++
		}
	}
	// Binomial(100, 0.01): P(≥ 8) < 1e-5.
	if canary >= 8 {
		t.Fatalf("%d of 100 ids chosen by the public hash reached the 1%% canary, want about 1", canary)
	}
}
