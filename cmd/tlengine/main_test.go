package main

import (
	"bytes"
	"strings"
	"testing"
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
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"--id", "e1", "--model", "smol"}, c.args...)
		if code := run(args, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), strings.TrimPrefix(c.args[0], "--")) || stdout.Len() != 0 {
			t.Errorf("%v: exit %d, stderr %q", c.args, code, &stderr)
		}
	}
}
