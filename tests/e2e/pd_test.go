package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/proctest"
)

// pdText is the generated text of a completions answer, JSON or SSE.
func pdText(t *testing.T, body string) string {
	t.Helper()
	var b strings.Builder
	one := func(data string) {
		var c struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("not a completion: %s", data)
		}
		if len(c.Choices) > 0 {
			b.WriteString(c.Choices[0].Text)
		}
	}
	if !strings.HasPrefix(body, "data: ") {
		one(body)
		return b.String()
	}
	for _, line := range strings.Split(body, "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok && data != "[DONE]" {
			one(data)
		}
	}
	return b.String()
}

// TestPDProtocolsOverProcesses (R22): a disaggregated route on pd_protocol = "vllm" and one on
// "sglang", each over tlengine processes speaking that protocol (static workers, the sglang
// prefill with its bootstrap_port), answer the tokens a unified engine answers for one seed,
// JSON and SSE. A decode engine killed while it holds a request before its first byte fails
// over (vllm: another decode with the same params; sglang: a new room) with no splice: the
// client gets one whole answer, equal to the unified one.
func TestPDProtocolsOverProcesses(t *testing.T) {
	type eng struct{ id, model, role, pd, extra string }
	sgBoot := freeAddr(t)
	_, sgPort, _ := net.SplitHostPort(sgBoot)
	engines := []eng{
		{"vm-p", "vm", "prefill", "vllm", ""},
		{"vm-d1", "vm", "decode", "vllm", "slow-headers=30s"},
		{"vm-d2", "vm", "decode", "vllm", ""},
		{"sg-p", "sg", "prefill", "sglang", ""},
		{"sg-d1", "sg", "decode", "sglang", "slow-headers=30s"},
		{"sg-d2", "sg", "decode", "sglang", ""},
	}
	procs := map[string]*proctest.Proc{}
	var toml strings.Builder
	toml.WriteString(`
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_miss_limit = 50

[[gateway.routes]]
model = "vm"
targets = ["disaggregated"]
pd_protocol = "vllm"

[[gateway.routes]]
model = "sg"
targets = ["disaggregated"]
pd_protocol = "sglang"
`)
	for _, e := range engines {
		addr := freeAddr(t)
		args := []string{"--id", e.id, "--model", e.model, "--role", e.role, "--pd", e.pd, "--http-listen", addr, "--bootstrap-port", "0"}
		if e.id == "sg-p" {
			args[len(args)-1] = sgPort
		}
		if e.extra != "" {
			args = append(args, "--fault", e.extra)
		}
		procs[e.id] = proctest.StartEngine(t, tlengineBin, args...)
		fmt.Fprintf(&toml, "\n[[gateway.static_workers]]\nid = %q\nmodel = %q\nhttp_address = %q\nrole = %q\nmetrics = \"tlengine\"\nscrape_interval = \"100ms\"\n",
			e.id, e.model, procs[e.id].HTTPAddr, e.role)
		if e.id == "sg-p" {
			fmt.Fprintf(&toml, "bootstrap_port = %s\n", sgPort)
		}
	}
	unified := map[string]*proctest.Proc{
		"vm": proctest.StartEngine(t, tlengineBin, "--id", "u-vm", "--model", "vm"),
		"sg": proctest.StartEngine(t, tlengineBin, "--id", "u-sg", "--model", "sg"),
	}
	f := &fleet{gw: startTLGW(t, toml.String())}
	f.base = "http://" + f.gw.HTTPAddr
	f.waitWorkers(t, "sg-d1", "sg-d2", "sg-p", "vm-d1", "vm-d2", "vm-p")

	const body = `{"model":%q,"prompt":"The gateway splits the request into a prefill and a decode","max_tokens":14,"seed":%d,"temperature":0.9,"stream":%v}`
	want := func(model string, seed int, stream bool) string {
		resp, b := post(t, "http://"+unified[model].HTTPAddr+"/v1/completions", "", fmt.Sprintf(body, model, seed, stream))
		if resp.StatusCode != 200 || pdText(t, b) == "" {
			t.Fatalf("unified %s: %d %s", model, resp.StatusCode, b)
		}
		return pdText(t, b)
	}
	for _, model := range []string{"vm", "sg"} {
		// The d1 engines stall before their headers: kill each while it holds the first
		// request, which then fails over before its first byte.
		t.Run(model+" decode killed before its first byte", func(t *testing.T) {
			type result struct {
				code int
				body string
			}
			done := make(chan result, 1)
			go func() {
				resp, b := postNoFatal(f.base+"/v1/completions", fmt.Sprintf(body, model, 3, true))
				done <- result{resp, b}
			}()
			d1 := model + "-d1"
			eventually(t, d1+" holds the request", 10*time.Second, func() bool {
				for _, w := range f.workers(t) {
					if w.ID == d1 && w.InFlight == 1 {
						return true
					}
				}
				return false
			})
			if err := procs[d1].Cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			var r result
			select {
			case r = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("the request did not end after its decode engine was killed")
			}
			if r.code != 200 || strings.Contains(r.body, "event: error") || !strings.HasSuffix(r.body, "data: [DONE]\n\n") {
				t.Fatalf("after the kill: %d %s", r.code, r.body)
			}
			if got, w := pdText(t, r.body), want(model, 3, true); got != w {
				t.Fatalf("after the kill: %q, unified %q (a splice?)", got, w)
			}
		})
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s stream %v", model, stream), func(t *testing.T) {
				for seed := 10; seed < 13; seed++ {
					resp, b := post(t, f.base+"/v1/completions", "", fmt.Sprintf(body, model, seed, stream))
					if resp.StatusCode != 200 {
						t.Fatalf("%d %s", resp.StatusCode, b)
					}
					if got, w := pdText(t, b), want(model, seed, stream); got != w {
						t.Fatalf("seed %d: disaggregated %q, unified %q", seed, got, w)
					}
				}
			})
		}
	}
}

// postNoFatal is post for a goroutine other than the test's: a transport error is code 0.
func postNoFatal(url, body string) (int, string) {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return resp.StatusCode, string(b) + "<read error: " + err.Error() + ">"
	}
	return resp.StatusCode, string(b)
}
