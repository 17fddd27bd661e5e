package accesslog

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/tlgw/tlgw/internal/clock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer is an output the test reads while the writer writes to it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// eventually polls cond until it holds, failing after 5 s (1 ms between polls, at most 5,000).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < 5000; i++ {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		<-time.After(time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func rec(id string) *Record {
	r := sampleRecord()
	r.RequestID = id
	return &r
}

func line(id string) string { return string(AppendJSON(nil, rec(id))) + "\n" }

// TestFlushOnTheClock: a line waits in the writer's buffer until FlushInterval has passed on
// the log's clock since it was written (not before), then reaches the output; the next line
// arms the next flush.
func TestFlushOnTheClock(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	out := &syncBuffer{}
	l := New(out, nil, Options{Clock: clk, Logger: quiet})
	defer l.Close()

	l.Record(rec("a"))
	eventually(t, "the flush armed", func() bool { return clk.Pending() == 1 })
	if d, _ := clk.Next(); d != FlushInterval {
		t.Fatalf("flush due in %v, want %v", d, FlushInterval)
	}
	clk.Advance(FlushInterval - time.Millisecond)
	if got := out.String(); got != "" {
		t.Fatalf("flushed before %v: %q", FlushInterval, got)
	}
	clk.Advance(time.Millisecond)
	eventually(t, "the line flushed", func() bool { return out.String() == line("a") })
	eventually(t, "no flush pending", func() bool { return clk.Pending() == 0 })

	l.Record(rec("b"))
	eventually(t, "the next flush armed", func() bool { return clk.Pending() == 1 })
	clk.Advance(FlushInterval)
	eventually(t, "the next line flushed", func() bool { return out.String() == line("a")+line("b") })
}

// TestCloseFlushes: Close writes every record handed over before it, in order, without the
// clock moving, and stops the writer (goleak); records after it are dropped and counted.
func TestCloseFlushes(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	out := &syncBuffer{}
	l := New(out, nil, Options{Clock: clk, Logger: quiet, Buffer: 100})
	var want strings.Builder
	for i := 0; i < 50; i++ {
		l.Record(rec(fmt.Sprint("r", i)))
		want.WriteString(line(fmt.Sprint("r", i)))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != want.String() {
		t.Fatalf("after Close:\n%s\nwant\n%s", got, want.String())
	}
	if n := clk.Pending(); n != 0 {
		t.Errorf("%d timers left armed after Close", n)
	}
	l.Record(rec("late"))
	if got := testutil.ToFloat64(l.dropped); got != 1 {
		t.Errorf("dropped after Close = %v, want 1", got)
	}
	if err := l.Close(); err != nil { // a second Close is harmless
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "late") {
		t.Error("a record after Close was written")
	}
}

// blockingWriter blocks every Write until release is closed, saying so on entered.
type blockingWriter struct {
	entered chan struct{}
	release chan struct{}
	out     syncBuffer
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	select {
	case w.entered <- struct{}{}:
	default:
	}
	<-w.release
	return w.out.Write(p)
}

// TestFullBufferDrops: while the writer is stuck on a slow output, Record never blocks: the
// buffer takes its capacity, and each record beyond it is dropped and counted; once the output
// moves again every buffered record is written.
func TestFullBufferDrops(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	w := &blockingWriter{entered: make(chan struct{}, 1), release: make(chan struct{})}
	reg := prometheus.NewRegistry()
	l := New(w, nil, Options{Clock: clk, Logger: quiet, Buffer: 2, Registerer: reg})

	l.Record(rec("first"))
	eventually(t, "the flush armed", func() bool { return clk.Pending() == 1 })
	clk.Advance(FlushInterval)
	select { // the writer is in the output's Write, and takes nothing from the buffer
	case <-w.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the writer never wrote")
	}
	for i := 0; i < 5; i++ {
		done := make(chan struct{})
		go func() { defer close(done); l.Record(rec(fmt.Sprint("r", i))) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Record blocked on a full buffer")
		}
	}
	if got := testutil.ToFloat64(l.dropped); got != 3 {
		t.Errorf("dropped = %v, want 3 (5 records, room for 2)", got)
	}
	close(w.release)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got, want := w.out.String(), line("first")+line("r0")+line("r1"); got != want {
		t.Errorf("written:\n%s\nwant\n%s", got, want)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP tlgw_access_log_dropped_total Access log records dropped because the log's buffer (access_log.buffer) was full, or the log was closed.
# TYPE tlgw_access_log_dropped_total counter
tlgw_access_log_dropped_total 3
# HELP tlgw_access_log_errors_total Access log writes that failed (the lines buffered with them are lost).
# TYPE tlgw_access_log_errors_total counter
tlgw_access_log_errors_total 0
`)); err != nil {
		t.Error(err)
	}
}

// failingWriter fails its first fails writes, then takes the rest.
type failingWriter struct {
	mu    sync.Mutex
	fails int
	out   bytes.Buffer
}

func (w *failingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fails > 0 {
		w.fails--
		return 0, errors.New("disk full")
	}
	return w.out.Write(p)
}

// TestWriteErrorCounted: a failed write is counted once and loses the lines buffered with it;
// the next lines are written again (a bufio.Writer would otherwise fail forever).
func TestWriteErrorCounted(t *testing.T) {
	clk := clock.NewFake(time.Unix(1000, 0))
	w := &failingWriter{fails: 1}
	var logged syncBuffer
	l := New(w, nil, Options{Clock: clk, Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	l.Record(rec("lost"))
	eventually(t, "the flush armed", func() bool { return clk.Pending() == 1 })
	clk.Advance(FlushInterval)
	eventually(t, "the failure counted", func() bool { return testutil.ToFloat64(l.errs) == 1 })
	l.Record(rec("kept"))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(l.errs); got != 1 {
		t.Errorf("errors = %v, want 1", got)
	}
	if got := w.out.String(); got != line("kept") {
		t.Errorf("written %q, want only the line after the failure", got)
	}
	if !strings.Contains(logged.String(), "disk full") {
		t.Errorf("the failure was not logged: %q", logged.String())
	}
}

// TestOpen: a file is opened to append (what it held stays) and created with mode 0640 at most
// (the umask may take more away); "-" is the given standard output; a path that cannot be
// opened is an error.
func TestOpen(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "access.log")
	if err := os.WriteFile(path, []byte("before\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := Open(path, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	l.Record(rec("a"))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "before\n"+line("a") {
		t.Errorf("file holds %q", b)
	}

	created := filepath.Join(dir, "new.log")
	l, err = Open(created, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(created)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm&^0o640 != 0 {
		t.Errorf("created with mode %v, want at most 0640", perm)
	}

	var stdout syncBuffer
	l, err = Open(Stdout, Options{Logger: quiet, Stdout: &stdout})
	if err != nil {
		t.Fatal(err)
	}
	l.Record(rec("out"))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if got := stdout.String(); got != line("out") {
		t.Errorf("stdout holds %q", got)
	}

	if _, err := Open(filepath.Join(dir, "missing", "x.log"), Options{Logger: quiet}); err == nil {
		t.Error("a file in a missing directory opened")
	}
}

// TestRecordAllocatesNothing: handing a record over costs no allocation, nor does the writer's
// line (on the fake clock the one flush timer stays armed; AllocsPerRun counts every goroutine).
func TestRecordAllocatesNothing(t *testing.T) {
	l := New(io.Discard, nil, Options{Logger: quiet, Clock: clock.NewFake(time.Unix(0, 0))})
	defer l.Close()
	r := rec("a")
	if n := testing.AllocsPerRun(1000, func() { l.Record(r) }); n != 0 {
		t.Errorf("Record: %v allocations", n)
	}
}
