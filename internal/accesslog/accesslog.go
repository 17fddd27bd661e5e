// Package accesslog is the gateway's access log (R24 `[access_log]`): one JSON line per finished
// inference request, for an operator to grep, written off the request path.
//
// A request actor hands its Record to Log.Record, which never blocks: the record goes into a
// channel of fixed capacity (access_log.buffer), or, when that is full, is dropped and counted
// (tlgw_access_log_dropped_total). One writer goroutine encodes each record as a line into a
// buffered writer, flushed at most FlushInterval after the first line it holds (on the injected
// clock) and at Close; a failed write is counted (tlgw_access_log_errors_total) and never reaches
// a request.
//
// A line holds no prompt text, no API key secret (the key's configured name only), no client
// address and no engine address; every string in it is JSON-escaped, and each is bounded where
// it comes from (a request id is at most 128 printable ASCII characters, a trace id 32 hex
// digits, a key name 64 characters, route names come from the configuration, served models and
// worker ids are at most 256 bytes each, R13.2), so a line is bounded too.
package accesslog

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tlgw/tlgw/internal/clock"
)

// The bounds and defaults of access_log.buffer and the writer.
const (
	DefaultBuffer = 8192
	MinBuffer     = 1
	MaxBuffer     = 65536
	// FlushInterval is the longest a written line waits in the writer's buffer.
	FlushInterval = 100 * time.Millisecond
	// bufferBytes is the writer's buffer: a full one is written at once.
	bufferBytes = 64 << 10
	// Stdout is the path that means the process's standard output.
	Stdout = "-"
)

// Record is one finished request, as the request actor knows it at its end. Strings are the
// gateway's own (route, served model, worker id, endpoint, outcome) or already validated (the
// request id, the trace id, the key name); none is ever a secret.
type Record struct {
	Time      time.Time // when the request finished (written in UTC, to the millisecond)
	RequestID string    // the X-Request-ID the gateway answered
	TraceID   string    // the W3C trace id (32 lowercase hex digits), or ""
	Key       string    // the API key's name ("" when the gateway serves without keys)
	Route     string    // the public route (the request metrics' route label)
	Model     string    // the served model (the request metrics' model label)
	Endpoint  string    // the endpoint's name (completions, chat, …)
	Worker    string    // the worker id of the last attempt, or ""
	Status    int       // the HTTP status, 499 when the client left first
	Attempts  int       // workers tried (each pick acted on)
	// TTFT is from arrival to the first byte of the answer relayed (a stream: its first
	// event); 0: there was none.
	TTFT     time.Duration
	Duration time.Duration // from arrival to the end
	// PromptTokens and CompletionTokens are the engine's usage when its answer reported it;
	// −1: not known.
	PromptTokens, CompletionTokens int64
	Stream                         bool
	Outcome                        string // how the request ended: ok, client_gone, interrupted, …
}

// Options configure a Log.
type Options struct {
	// Buffer is how many records may wait for the writer (DefaultBuffer when 0); one more is
	// dropped and counted.
	Buffer     int
	Clock      clock.Clock           // times the flushes (default the real clock)
	Registerer prometheus.Registerer // receives the log's counters (nil: unregistered)
	Logger     *slog.Logger          // reports write errors (default slog.Default())
	// Stdout is where the path "-" writes (default os.Stdout).
	Stdout io.Writer
}

// Log is an open access log. Its methods are safe for concurrent use.
type Log struct {
	records chan Record   // bounded by Options.Buffer
	flushC  chan struct{} // capacity 1: a due flush, sent by the flush timer
	stop    chan struct{} // closed by Close
	done    chan struct{} // closed when the writer has returned
	closed  atomic.Bool
	once    sync.Once

	dropped prometheus.Counter
	errs    prometheus.Counter

	// The writer's own (its goroutine only).
	w       io.Writer     // the file, or standard output
	out     *bufio.Writer // buffers w
	closer  io.Closer     // the file, closed after the last flush (nil: standard output)
	clk     clock.Clock
	timer   clock.Timer // the pending flush, or nil: nothing is waiting in out
	line    []byte      // the line being encoded, reused: bounded by the longest line
	log     *slog.Logger
	failing bool // the last write failed: the next failure is counted, not logged again
}

// Open opens the log at path: Stdout ("-") is the process's standard output, any other path a
// file opened to append, created with mode 0640. The writer runs until Close.
func Open(path string, o Options) (*Log, error) {
	if path == Stdout {
		w := o.Stdout
		if w == nil {
			w = os.Stdout
		}
		return New(w, nil, o), nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("access log: %w", err)
	}
	return New(f, f, o), nil
}

// New starts a log writing lines to w; closer (nil: none) is closed at Close, after the last
// flush.
func New(w io.Writer, closer io.Closer, o Options) *Log {
	if o.Buffer <= 0 {
		o.Buffer = DefaultBuffer
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	l := &Log{
		records: make(chan Record, o.Buffer),
		flushC:  make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tlgw_access_log_dropped_total",
			Help: "Access log records dropped because the log's buffer (access_log.buffer) was full, or the log was closed.",
		}),
		errs: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tlgw_access_log_errors_total",
			Help: "Access log writes that failed (the lines buffered with them are lost).",
		}),
		w:      w,
		out:    bufio.NewWriterSize(w, bufferBytes),
		closer: closer,
		clk:    o.Clock,
		log:    o.Logger,
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(l.dropped, l.errs)
	}
	go l.run() // ends at Close
	return l
}

// Record hands r to the writer without blocking: when the buffer is full, or the log is closed,
// r is dropped and counted.
func (l *Log) Record(r *Record) {
	if l.closed.Load() {
		l.dropped.Inc()
		return
	}
	select {
	case l.records <- *r:
	default:
		l.dropped.Inc()
	}
}

// Close writes what is buffered, flushes, closes the file and stops the writer; records handed
// over after it are dropped. It returns the error of closing the file.
func (l *Log) Close() error {
	var err error
	l.once.Do(func() {
		l.closed.Store(true)
		close(l.stop)
		<-l.done
		if l.closer != nil {
			err = l.closer.Close()
		}
	})
	return err
}

// run is the writer: it encodes each record into out, flushes when a flush falls due, and at
// stop writes what is left in the buffer, flushes and returns.
func (l *Log) run() {
	defer close(l.done)
	for {
		select {
		case r := <-l.records:
			l.write(&r)
		case <-l.flushC:
			l.flush()
		case <-l.stop:
			// Records handed over before the stop are written; a record racing with Close
			// may stay in the channel, unwritten (Record counts those it sees closed).
			for {
				select {
				case r := <-l.records:
					l.write(&r)
					continue
				default:
				}
				break
			}
			l.flush()
			return
		}
	}
}

// write encodes r as a line into out, and arms the flush if none is pending.
func (l *Log) write(r *Record) {
	l.line = AppendJSON(l.line[:0], r)
	l.line = append(l.line, '\n')
	if _, err := l.out.Write(l.line); err != nil {
		l.failed(err)
		return
	}
	if l.timer == nil && l.out.Buffered() > 0 {
		flushC := l.flushC
		l.timer = l.clk.AfterFunc(FlushInterval, func() {
			select {
			case flushC <- struct{}{}:
			default: // one is pending already
			}
		})
	}
}

// flush writes out's buffer.
func (l *Log) flush() {
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	if err := l.out.Flush(); err != nil {
		l.failed(err)
		return
	}
	l.failing = false
}

// failed counts a failed write. A bufio.Writer keeps its first error forever: it is reset, so
// the lines buffered with the failure are lost and the next write tries the file again. The
// first failure of a run of them is logged.
func (l *Log) failed(err error) {
	l.errs.Inc()
	if !l.failing {
		l.failing = true
		l.log.Error("access log: write failed; the lines buffered with it are lost", "err", err)
	}
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	l.out.Reset(l.w)
}
