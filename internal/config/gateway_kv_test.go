package config

import (
	"strings"
	"testing"
)

func TestKVEventsAndTokenizerErrors(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"[gateway.kv_events]\nlisten = \"nohost\"", "gateway.kv_events.listen"},
		{"[gateway.kv_events]\nlisten = \"127.0.0.1:0\"", "fixed port"},
		{"[gateway.kv_events]\nlisten = \":5557\"", "gateway.kv_events.listen"},
		{"[gateway.kv_events]\nlisten = \"h:99999\"", "gateway.kv_events.listen"},
		{"[gateway.kv_events]\nmax_blocks_per_worker = 0", "max_blocks_per_worker"},
		{"[gateway.kv_events]\nmax_blocks_per_worker = 1048577", "max_blocks_per_worker"},
		{"[gateway]\ntokenizer = \"hf\"", "gateway.tokenizer"},
		{"[gateway]\ntokenizer_endpoint = \"detokenize\"", "gateway.tokenizer_endpoint"},
		{"[gateway]\ntokenizer_timeout = \"0s\"", "gateway.tokenizer_timeout"},
		{"[gateway]\ntokenizer_timeout = \"11s\"", "gateway.tokenizer_timeout"},
		{"[[gateway.static_workers]]\nid = \"a\"\nmodel = \"m\"\nhttp_address = \"127.0.0.1:8000\"\nmetrics = \"vllm\"\nkv_events_endpoint = \"127.0.0.1:5557\"", "kv_events_endpoint"},
	} {
		_, err := Parse([]byte(c.src), env(nil))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one naming %q", c.src, err, c.want)
		}
	}
	// The bounds themselves parse.
	for _, src := range []string{
		"[gateway.kv_events]\nmax_blocks_per_worker = 1",
		"[gateway.kv_events]\nmax_blocks_per_worker = 1048576",
		"[gateway]\ntokenizer_timeout = \"1ms\"",
		"[gateway]\ntokenizer_timeout = \"10s\"",
		"[[gateway.static_workers]]\nid = \"a\"\nmodel = \"m\"\nhttp_address = \"127.0.0.1:8000\"\nmetrics = \"vllm\"\nkv_events_endpoint = \"tcp://127.0.0.1:5557?replay=tcp://127.0.0.1:5558\"",
	} {
		if _, err := Parse([]byte(src), env(nil)); err != nil {
			t.Errorf("%q: %v", src, err)
		}
	}
}
