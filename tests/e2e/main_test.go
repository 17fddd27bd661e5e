// Package e2e drives the tlgw binary as a process over real sockets on loopback.
package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var tlgwBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tlgw-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tlgwBin = filepath.Join(dir, "tlgw")
	build := exec.Command("go", "build", "-o", tlgwBin, "github.com/tlgw/tlgw/cmd/tlgw")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building tlgw:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running tlgw process.
type proc struct {
	cmd      *exec.Cmd
	httpAddr string
	grpcAddr string
	mu       sync.Mutex
	stderr   strings.Builder
	done     chan error
}

func (p *proc) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

var listening = regexp.MustCompile(`^tlgw listening http=(\S+) registry=(\S+)$`)

// startTLGW runs `tlgw serve --config` with the given TOML and waits for its listening line.
// The process is stopped (SIGTERM, then SIGKILL) when the test ends.
func startTLGW(t *testing.T, toml string) *proc {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "tlgw.toml")
	if err := os.WriteFile(cfg, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: exec.Command(tlgwBin, "serve", "--config", cfg), done: make(chan error, 1)}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		b, _ := io.ReadAll(stderr)
		p.mu.Lock()
		p.stderr.Write(b)
		p.mu.Unlock()
	}()
	addrs := make(chan [2]string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				addrs <- [2]string{m[1], m[2]}
			}
		}
	}()
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	select {
	case a := <-addrs:
		p.httpAddr, p.grpcAddr = a[0], a[1]
	case err := <-p.done:
		t.Fatalf("tlgw exited before listening: %v\n%s", err, p.logs())
	case <-time.After(20 * time.Second):
		t.Fatalf("tlgw did not print its listening line\n%s", p.logs())
	}
	return p
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
