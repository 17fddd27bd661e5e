// Package proctest runs tlgw and tlengine binaries as processes for end-to-end tests and benchmarks:
// build once, start with a config, wait for the listening line, stop on cleanup.
package proctest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Build compiles the main package pkg into dir and returns the binary's path.
func Build(dir, pkg string) (string, error) {
	bin := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building %s: %w", pkg, err)
	}
	return bin, nil
}

// RunWithBinaries is a TestMain for packages that run tlgw and tlengine processes: it builds
// both into a temporary directory, sets *tlgw and *tlengine to their paths, runs the tests,
// removes the directory and exits with the tests' code (1 when a build fails).
func RunWithBinaries(m *testing.M, tlgw, tlengine *string) {
	dir, err := os.MkdirTemp("", "tlgw-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*tlgw, err = Build(dir, "github.com/tlgw/tlgw/cmd/tlgw")
	if err == nil {
		*tlengine, err = Build(dir, "github.com/tlgw/tlgw/cmd/tlengine")
	}
	code := 1
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// Proc is a running tlgw or tlengine process.
type Proc struct {
	Cmd      *exec.Cmd
	HTTPAddr string
	GRPCAddr string // tlgw: the registry; tlengine: EngineControl
	KVAddr   string // tlengine only
	// tlengine with --kv-events (R22): "bind" or "connect", the PUB's address (bound, on the
	// advertised host; or the one it dials) and the replay ROUTER's ("" when none); all ""
	// without KV events.
	KVEventsMode, KVEventsAddr, KVReplayAddr string

	exited  chan struct{} // closed when the process has exited
	exitErr error         // set before exited is closed

	mu     sync.Mutex
	stderr strings.Builder
}

// Exited is closed once the process has exited; Err then tells how.
func (p *Proc) Exited() <-chan struct{} { return p.exited }

// Err is the process's exit error (nil for exit code 0), valid once Exited is closed.
func (p *Proc) Err() error { return p.exitErr }

// maxLogs bounds the stderr a Proc keeps: past it the older half is dropped.
const maxLogs = 16 << 20

// Write keeps what the process writes to stderr (its last maxLogs bytes at most).
func (p *Proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stderr.Len()+len(b) > maxLogs {
		keep := p.stderr.String()
		keep = keep[min(len(keep), len(keep)/2+len(b)):]
		p.stderr.Reset()
		p.stderr.WriteString(keep)
	}
	p.stderr.Write(b)
	return len(b), nil
}

// Logs returns what the process wrote to stderr so far.
func (p *Proc) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

var (
	tlgwLine     = regexp.MustCompile(`^tlgw listening http=(\S+) registry=(\S+)$`)
	tlengineLine = regexp.MustCompile(`^tlengine listening http=(\S+) grpc=(\S+) kv=(\S+)$`)
	bareLine     = regexp.MustCompile(`^bareproxy listening http=(\S+)$`) // tests/bench/bareproxy
	// kvEventsLine precedes tlengine's listening line when it publishes KV events; replay=- is none.
	kvEventsLine = regexp.MustCompile(`^tlengine kv-events mode=(bind|connect) events=(\S+) replay=(\S+)$`)
)

// StartTLGW runs `bin serve --config` with the given TOML and waits for its listening line.
// The process is stopped (SIGTERM, then SIGKILL after 10 s) when the test ends.
func StartTLGW(t testing.TB, bin, toml string) *Proc {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "tlgw.toml")
	if err := os.WriteFile(cfg, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	return Start(t, bin, []string{"serve", "--config", cfg})
}

// StartEngine runs tlengine with args and waits for its listening line.
func StartEngine(t testing.TB, bin string, args ...string) *Proc {
	t.Helper()
	return Start(t, bin, args)
}

// Start runs bin with args and waits for a tlgw, tlengine or bareproxy listening line on stdout, whose
// addresses it records. The process is stopped (SIGTERM, then SIGKILL) when the test ends.
func Start(t testing.TB, bin string, args []string) *Proc {
	t.Helper()
	p := &Proc{Cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	stdout, err := p.Cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := p.Cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.Copy(p, stderr) }() // ends when the process's stderr closes
	addrs := make(chan []string, 1)           // http, grpc, kv, then the KV events mode, events, replay
	go func() {
		sc := bufio.NewScanner(stdout)
		kvEvents := []string{"", "", ""}
		for sc.Scan() {
			if m := tlgwLine.FindStringSubmatch(sc.Text()); m != nil {
				addrs <- append(m[1:], "", "", "", "")
			} else if m := kvEventsLine.FindStringSubmatch(sc.Text()); m != nil {
				kvEvents = m[1:]
				if kvEvents[2] == "-" {
					kvEvents[2] = ""
				}
			} else if m := tlengineLine.FindStringSubmatch(sc.Text()); m != nil {
				addrs <- append(m[1:], kvEvents...)
			} else if m := bareLine.FindStringSubmatch(sc.Text()); m != nil {
				addrs <- []string{m[1], "", "", "", "", ""}
			}
		}
	}()
	go func() {
		p.exitErr = p.Cmd.Wait()
		close(p.exited)
	}()
	waitExit := func(d time.Duration) bool {
		select {
		case <-p.exited:
			return true
		case <-time.After(d):
			return false
		}
	}
	t.Cleanup(func() {
		_ = p.Cmd.Process.Signal(syscall.SIGTERM)
		if !waitExit(10 * time.Second) {
			_ = p.Cmd.Process.Kill()
			waitExit(10 * time.Second)
		}
	})
	select {
	case a := <-addrs:
		p.HTTPAddr, p.GRPCAddr, p.KVAddr = a[0], a[1], a[2]
		p.KVEventsMode, p.KVEventsAddr, p.KVReplayAddr = a[3], a[4], a[5]
	case <-p.exited:
		t.Fatalf("process exited before listening: %v\n%s", p.exitErr, p.Logs())
	case <-time.After(20 * time.Second):
		t.Fatalf("process did not print its listening line\n%s", p.Logs())
	}
	return p
}

// CPUTime is the user+system CPU time the process has used, from /proc (Linux).
func (p *Proc) CPUTime() (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses and may contain spaces.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0, fmt.Errorf("short /proc stat: %q", s)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parsing /proc stat: %q", s)
	}
	const ticksPerSecond = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticksPerSecond, nil
}

// Stop SIGSTOPs the process and waits until every one of its threads is stopped. kill returns
// before that: the kernel starts the group stop in one thread, and the others keep running
// until it has, which under load is long enough for an engine to answer a few requests.
func (p *Proc) Stop(t testing.TB) {
	t.Helper()
	p.signalAndWait(t, syscall.SIGSTOP, true)
}

// Cont SIGCONTs the process and waits until none of its threads is stopped any more.
func (p *Proc) Cont(t testing.TB) {
	t.Helper()
	p.signalAndWait(t, syscall.SIGCONT, false)
}

func (p *Proc) signalAndWait(t testing.TB, sig syscall.Signal, stopped bool) {
	t.Helper()
	if err := p.Cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%v to pid %d: %v", sig, p.Cmd.Process.Pid, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		all, err := p.threadsStopped(stopped)
		if err != nil {
			t.Fatalf("after %v: %v", sig, err)
		}
		if all {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d: threads not all %s 10 s after %v", p.Cmd.Process.Pid, map[bool]string{true: "stopped", false: "running"}[stopped], sig)
		}
		<-tick.C
	}
}

// threadsStopped reports whether every thread of the process is (stopped) or is not (!stopped)
// in the stopped state T, from /proc/PID/task/*/stat (Linux).
func (p *Proc) threadsStopped(stopped bool) (bool, error) {
	dir := fmt.Sprintf("/proc/%d/task", p.Cmd.Process.Pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
		if err != nil {
			continue // the thread ended
		}
		// The state follows the parenthesised command name, which may itself hold spaces.
		i := strings.LastIndexByte(string(b), ')')
		if i < 0 || i+2 >= len(b) {
			return false, fmt.Errorf("%s/%s/stat: %q", dir, task.Name(), b)
		}
		if (b[i+2] == 'T') != stopped {
			return false, nil
		}
	}
	return true, nil
}
