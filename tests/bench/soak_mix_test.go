package bench

import (
	"fmt"
	"strings"
)

// The soak's workload (SPEC R19), shared by the in-process test (TestSoakHeapObjects, driven by
// a Go client) and the soak over processes (BenchmarkSoak, driven by wrk with soakLua): request
// n is soakMix[n % len(soakMix)] with a prompt of its own, so every routing path of a production
// gateway runs over and over with admission, sessions, rate limits and the prefix index on.

// soakGatewayTOML is the soak's gateway: admission with a low busy threshold (requests do
// queue, in session lanes and the shared one), a cascade route, a disaggregated route, an API key
// with rate limits, registry tokens, prefix_aware with its prefix index, outlier ejection and the
// R14 timeouts (defaults). %s is heartbeat_interval.
const soakGatewayTOML = `
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
route_policy = "prefix_aware"
heartbeat_interval = "%s"

[[gateway.routes]]
model = "auto"
cascade = [{ model = "smol", accept_if = "mean_logprob > -1.0" }, { model = "big" }]

[[gateway.routes]]
model = "smol-pd"
backends = [{ model = "smol", weight = 1 }]
targets = ["disaggregated"]

[[auth.keys]]
key = "sk-soak"
scopes = ["inference", "admin"]
rpm = 1000000000
tpm = 1000000000000

[registry]
tokens = [{ token = "engine-secret" }]

[admission]
busy_threshold = 8
default_class = "interactive"

[[admission.classes]]
name = "interactive"
queue_limit = 100000
max_wait = "60s"
`

const soakKey, soakEngineToken = "sk-soak", "engine-secret"

// soakKind is one kind of request in the mix.
type soakKind struct {
	path, model           string
	stream, chat, session bool
}

// soakMix: plain JSON and SSE, chat, a cascade (non-streamed: both steps may run; streamed:
// straight to the last), the disaggregated route (tokenize, Prefill and KV push, decode), and
// sessions (X-Session-ID: a session lane per session while it queues).
var soakMix = []soakKind{
	{path: "/v1/completions", model: "smol"},
	{path: "/v1/completions", model: "smol", stream: true},
	{path: "/v1/chat/completions", model: "smol", chat: true, session: true},
	{path: "/v1/chat/completions", model: "smol", stream: true, chat: true},
	{path: "/v1/completions", model: "auto"},
	{path: "/v1/completions", model: "auto", session: true},
	{path: "/v1/completions", model: "auto", stream: true},
	{path: "/v1/completions", model: "smol-pd"},
	{path: "/v1/completions", model: "smol-pd", stream: true, session: true},
	{path: "/v1/completions", model: "smol", session: true},
	{path: "/v1/completions", model: "smol", stream: true, session: true},
}

// soakTurns is how many of its requests a session makes before the next session takes over:
// sessions come and go all the time, as a real fleet's do.
const soakTurns = 4

// soakFiller follows each request's own prefix in its prompt (about 300 bytes of prompt).
var soakFiller = strings.Repeat("tell me about routing requests across engines. ", 6)

// soakBody is request n's body: its own prompt (prompts modulo distinct: a bounded set, so the
// prefix caches reach their steady state in the warm-up; 0 = every prompt different) made of
// filler, 4 to 19 tokens, a seed. The soak over processes sends soakFiller (soakLua); the
// in-process test a shorter one, as the race detector makes every byte handled dear.
func soakBody(k soakKind, n, distinct int, filler string) string {
	p := n
	if distinct > 0 {
		p = n % distinct
	}
	prompt := fmt.Sprintf("soak prompt %d: %s", p, filler)
	maxTokens, seed := 4+n%16, n%1000
	if k.chat {
		return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"seed":%d,"stream":%v}`,
			k.model, prompt, maxTokens, seed, k.stream)
	}
	return fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":%d,"seed":%d,"stream":%v}`, k.model, prompt, maxTokens, seed, k.stream)
}

// soakSession is the X-Session-ID of request n of client (or wrk thread) c.
func soakSession(c, n int) string { return fmt.Sprintf("soak-%d-%d", c, n/(len(soakMix)*soakTurns)) }

// soakLua is wrk's script for the mix: each thread sends the mix with its own request numbers
// (thread t of nt sends n = t, t + nt, …), stops after its quota of answers (wrk's arguments
// after "--": the quota per thread, the thread count, the first request number), and counts
// outcomes: 200
// (for a stream: ended by data: [DONE]), a stream interrupted by the R6 error event, a stream
// that ended with neither, and the other statuses by class. done prints one SOAK line.
func soakLua() string {
	var sb strings.Builder
	sb.WriteString("local kinds = {\n")
	for _, k := range soakMix {
		fmt.Fprintf(&sb, "  {path=%q, model=%q, stream=%v, chat=%v, session=%v},\n", k.path, k.model, k.stream, k.chat, k.session)
	}
	sb.WriteString("}\n")
	fmt.Fprintf(&sb, "local filler = %q\nlocal turns = %d\nlocal key = %q\n", soakFiller, soakTurns, soakKey)
	sb.WriteString(`
local threads = {}
function setup(t)
  t:set("tid", #threads)
  table.insert(threads, t)
end
function init(args)
  quota, nthreads, offset = tonumber(args[1]), tonumber(args[2]), tonumber(args[3])
  seq, answered, stopped = 0, 0, false
  ok, interrupted, truncated, s4xx, s429, s502, s503, s504, s5xx = 0, 0, 0, 0, 0, 0, 0, 0, 0
end
function request()
  local n = offset + seq * nthreads + tid
  seq = seq + 1
  local k = kinds[(n % #kinds) + 1]
  local prompt = "soak prompt " .. n .. ": " .. filler
  local maxt, seed = 4 + n % 16, n % 1000
  local body
  if k.chat then
    body = string.format('{"model":"%s","messages":[{"role":"user","content":"%s"}],"max_tokens":%d,"seed":%d,"stream":%s}',
      k.model, prompt, maxt, seed, tostring(k.stream))
  else
    body = string.format('{"model":"%s","prompt":"%s","max_tokens":%d,"seed":%d,"stream":%s}',
      k.model, prompt, maxt, seed, tostring(k.stream))
  end
  local h = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. key}
  if k.session then
    h["X-Session-ID"] = string.format("soak-%d-%d", tid, math.floor(n / (#kinds * turns)))
  end
  return wrk.format("POST", k.path, h, body)
end
function response(status, headers, body)
  answered = answered + 1
  if status == 200 then
    if string.sub(body, 1, 6) == "data: " or string.sub(body, 1, 7) == "event: " then
      if string.find(body, "data: [DONE]", 1, true) then ok = ok + 1
      elseif string.find(body, "event: error", 1, true) then interrupted = interrupted + 1
      else truncated = truncated + 1 end
    else
      ok = ok + 1
    end
  elseif status == 429 then s429 = s429 + 1
  elseif status == 502 then s502 = s502 + 1
  elseif status == 503 then s503 = s503 + 1
  elseif status == 504 then s504 = s504 + 1
  elseif status >= 500 then s5xx = s5xx + 1
  else s4xx = s4xx + 1 end
  if answered >= quota and not stopped then
    -- wrk sleeps out its -d even when every thread has stopped: the line tells the driver to
    -- interrupt it (SIGINT) once every thread has its quota.
    stopped = true
    io.write("SOAK-QUOTA\n")
    io.flush()
    wrk.thread:stop()
  end
end
function done(summary, latency, requests)
  local t = {answered=0, ok=0, interrupted=0, truncated=0, s4xx=0, s429=0, s502=0, s503=0, s504=0, s5xx=0}
  for _, th in ipairs(threads) do
    for name, _ in pairs(t) do t[name] = t[name] + th:get(name) end
  end
  local e = summary.errors
  io.write(string.format("SOAK answered=%d ok=%d interrupted=%d truncated=%d s4xx=%d s429=%d s502=%d s503=%d s504=%d s5xx=%d sockerr=%d duration_us=%d p50_us=%d p99_us=%d\n",
    t.answered, t.ok, t.interrupted, t.truncated, t.s4xx, t.s429, t.s502, t.s503, t.s504, t.s5xx,
    e.connect + e.read + e.write + e.timeout, summary.duration, latency:percentile(50), latency:percentile(99)))
end
`)
	return sb.String()
}
