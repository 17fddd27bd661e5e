// Package ops checks the operations artifacts of SPEC R17.2 with the real tools: promtool checks
// deploy/prometheus/rules.yml and prometheus.yml and runs the rules' unit tests, and a real
// Prometheus scraping a running gateway runs every query of deploy/grafana/tlgw.json.
//
// The tools come from Debian's prometheus package (/usr/bin/prometheus, /usr/bin/promtool); a
// missing one fails the test, never skips it.
package ops

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	// The live test runs binaries it builds, which the go test cache cannot see. Importing the
	// packages those binaries are made of ties this package's cached result to their sources.
	_ "github.com/tlgw/tlgw/internal/app"
	_ "github.com/tlgw/tlgw/sim/engine"
)

// repoRoot is the module's root, relative to this package's directory (go test's working dir).
const repoRoot = "../.."

// deployPath is a file under deploy/, relative to the test's working directory.
func deployPath(parts ...string) string {
	return filepath.Join(append([]string{repoRoot, "deploy"}, parts...)...)
}

// readDeploy reads a file under deploy/. Reading it here (not only in a subprocess) makes go test's
// cache re-run the tests when it changes.
func readDeploy(t *testing.T, parts ...string) []byte {
	t.Helper()
	b, err := os.ReadFile(deployPath(parts...))
	if err != nil {
		t.Fatalf("reading %s: %v", filepath.Join(parts...), err)
	}
	return b
}

// tool is the path of a Prometheus tool; it fails the test, naming the package, when absent.
func tool(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if p := "/usr/bin/" + name; isExecutable(p) {
		return p
	}
	t.Fatalf("%s not found on PATH or in /usr/bin: these tests run the real tool. Install Debian's "+
		"prometheus package, which provides /usr/bin/prometheus and /usr/bin/promtool: "+
		"sudo apt-get install -y prometheus", name)
	return ""
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// run runs a tool to completion (bounded) in dir and returns its combined output.
func run(t *testing.T, dir string, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("%s %s: still running after 30 s\n%s", filepath.Base(bin), strings.Join(args, " "), out)
	}
	return string(out), err
}
