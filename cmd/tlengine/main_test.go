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
