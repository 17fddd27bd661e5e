package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tlgw/tlgw/internal/vllmkv"
	"github.com/tlgw/tlgw/sim/engine"
)

// TestGatewayFlag: a bad --gateway entry exits 2 before anything starts, naming the entry;
// the help text names both forms.
func TestGatewayFlag(t *testing.T) {
	for _, bad := range []string{"gw", "gw:0", "unix:///tmp/s", "dns:gw:9090", "dns://8.8.8.8/gw:9090", "dns:///a..b:1"} {
		var stdout, stderr bytes.Buffer
		code := run([]string{"--id", "e1", "--model", "smol", "--gateway", "ok:1," + bad}, &stdout, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), "--gateway") || !strings.Contains(stderr.String(), bad) || stdout.Len() != 0 {
			t.Errorf("--gateway %q: exit %d, stderr %q, stdout %q; want 2 naming the entry", bad, code, &stderr, &stdout)
		}
	}
	var stderr bytes.Buffer
	if code := run([]string{"-h"}, &bytes.Buffer{}, &stderr); code != 2 || !strings.Contains(stderr.String(), "dns:///name:port") {
		t.Fatalf("help: exit %d, %q", code, &stderr)
	}
}

// TestServingFlags: a bad --endpoints name, --lora entry, --lora-swap-ms or --max-loras fails before
// anything is served (exit 2 for the flags, 1 for the engine's check), naming the flag.
func TestServingFlags(t *testing.T) {
	for _, c := range []struct{ args []string }{
		{[]string{"--endpoints", "chat,nope"}},
		{[]string{"--lora", "smol"}},
		{[]string{"--lora", "a,a"}},
		{[]string{"--lora-swap-ms", "-1"}},
		{[]string{"--max-loras", "-2"}},
		{[]string{"--pd", "nixl"}},
		{[]string{"--bootstrap-port", "70000"}},
		{[]string{"--pd-timeout", "-1s"}},
		{[]string{"--otlp-endpoint", "collector"}},
		{[]string{"--otlp-endpoint", "collector:0"}},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"--id", "e1", "--model", "smol"}, c.args...)
		if code := run(args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), strings.TrimPrefix(c.args[0], "--")) || stdout.Len() != 0 {
			t.Errorf("%v: exit %d, stderr %q", c.args, code, &stderr)
		}
	}
}

// TestKVEventsFlags: --kv-events takes zmq:// or tcp://; the format is array or map; a replay
// needs events; a connect address needs a host and a port; each failure names its flag.
func TestKVEventsFlags(t *testing.T) {
	for _, c := range []struct {
		events, format, replay string
		want                   engine.KVEventsConfig
		err                    string
	}{
		{"zmq://*:0", "array", "", engine.KVEventsConfig{Addr: "*:0"}, ""},
		{"tcp://127.0.0.1:5557", "map", "tcp://127.0.0.1:5558", engine.KVEventsConfig{Addr: "127.0.0.1:5557", Format: vllmkv.Map, Replay: "127.0.0.1:5558"}, ""},
		{"zmq://h:1", "array", "h:2", engine.KVEventsConfig{Addr: "h:1", Replay: "h:2"}, ""},
		{"", "array", "", engine.KVEventsConfig{}, ""},
		{"h:1", "array", "", engine.KVEventsConfig{}, "--kv-events"},
		{"zmq://", "array", "", engine.KVEventsConfig{}, "--kv-events"},
		{"zmq://h:1", "json", "", engine.KVEventsConfig{}, "--kv-events-format"},
		{"", "array", "h:2", engine.KVEventsConfig{}, "--kv-replay"},
	} {
		var k engine.KVEventsConfig
		err := parseKVEvents(&k, c.events, c.format, c.replay)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q %q %q: %v, want an error naming %s", c.events, c.format, c.replay, err, c.err)
			}
			continue
		}
		if err != nil || k != c.want {
			t.Errorf("%q %q %q: %+v, %v; want %+v", c.events, c.format, c.replay, k, err, c.want)
		}
	}
	for _, c := range []struct {
		args []string
		code int
		flag string
	}{
		{[]string{"--kv-events", "h:1"}, 2, "kv-events"},
		{[]string{"--kv-events-format", "xml"}, 2, "kv-events-format"},
		{[]string{"--kv-replay", "127.0.0.1:0"}, 2, "kv-replay"},
		{[]string{"--kv-events", "zmq://*:5557", "--kv-events-bind=false"}, 1, "kv-events"},
		{[]string{"--kv-events", "zmq://127.0.0.1:0", "--kv-replay", "nohost"}, 1, "kv-replay"},
		{[]string{"--kv-hash-seed", "-1"}, 2, "kv-hash-seed"},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"--id", "e1", "--model", "smol"}, c.args...)
		if code := run(args, &stdout, &stderr); code != c.code || !strings.Contains(stderr.String(), c.flag) || stdout.Len() != 0 {
			t.Errorf("%v: exit %d (want %d), stderr %q", c.args, code, c.code, &stderr)
		}
	}
}
