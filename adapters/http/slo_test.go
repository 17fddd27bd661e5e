package httpapi_test

import (
	"strings"
	"sync"
	"testing"

	"github.com/tlgw/tlgw/actors/request"
)

// TestSLOTTFTHeader (R18.4): X-TL-SLO-TTFT-Ms is a positive integer of milliseconds, 1 to
// 3,600,000, carried on the exchange (0 without the header); anything else is a 400
// invalid_request naming the header that reaches no engine. Admission need not be on.
func TestSLOTTFTHeader(t *testing.T) {
	var mu sync.Mutex
	var seen []*request.Exchange
	s := newStack(t, stackOpt{keys: testKeys, served: func(x *request.Exchange) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, x)
	}})
	e := jsonEngine(t, "w1")
	s.beat("w1", "smol", e)
	body := `{"model":"smol","prompt":"hi"}`
	for _, c := range []struct {
		hdr  []string
		want int64
	}{
		{nil, 0},
		{[]string{"X-TL-SLO-TTFT-Ms", "1"}, 1},
		{[]string{"X-TL-SLO-TTFT-Ms", "250"}, 250},
		{[]string{"x-tl-slo-ttft-ms", "3600000"}, 3_600_000},
	} {
		mu.Lock()
		seen = nil
		mu.Unlock()
		resp, b := s.do(t, "POST", "/v1/completions", "sk-inference", body, c.hdr...)
		if resp.StatusCode != 200 {
			t.Fatalf("%v: %d %s, want 200", c.hdr, resp.StatusCode, b)
		}
		mu.Lock()
		if len(seen) != 1 || seen[0].SLOTTFTMs != c.want {
			t.Fatalf("%v: %d exchanges, want one with SLOTTFTMs %d", c.hdr, len(seen), c.want)
		}
		mu.Unlock()
	}
	calls := len(e.calls())
	for _, v := range []string{"0", "-5", "3600001", "1.5", "+7", "1e3", "ten", "", "99999999999999999999"} {
		resp, b := s.do(t, "POST", "/v1/completions", "sk-inference", body, "X-TL-SLO-TTFT-Ms", v)
		if resp.StatusCode != 400 || errCode(t, b) != "invalid_request" || !strings.Contains(string(b), "X-TL-SLO-TTFT-Ms") {
			t.Fatalf("%q: %d %s, want 400 invalid_request naming the header", v, resp.StatusCode, b)
		}
	}
	if n := len(e.calls()); n != calls {
		t.Fatalf("bad headers reached the engine %d times", n-calls)
	}
	s.InFlight("w1", 0)
}
