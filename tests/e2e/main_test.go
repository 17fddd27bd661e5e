// Package e2e drives the tlgw binary as a process over real sockets on loopback.
package e2e

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/tlgw/tlgw/internal/proctest"
)

var tlgwBin, tlengineBin string

func TestMain(m *testing.M) { proctest.RunWithBinaries(m, &tlgwBin, &tlengineBin) }

// startTLGW runs `tlgw serve --config` with the given TOML (see proctest.StartTLGW).
func startTLGW(t *testing.T, toml string) *proctest.Proc {
	t.Helper()
	return proctest.StartTLGW(t, tlgwBin, toml)
}

// runTLGW runs tlgw to completion with args and returns its exit code and output.
func runTLGW(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, tlgwBin, args...).CombinedOutput()
	if err == nil {
		return 0, string(out)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("running tlgw %v: %v", args, err)
	return -1, ""
}
