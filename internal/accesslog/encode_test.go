package accesslog

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// stdLine is a record as encoding/json writes it: the reference AppendJSON is held to.
type stdLine struct {
	Time             string   `json:"time"`
	RequestID        string   `json:"request_id"`
	TraceID          string   `json:"trace_id"`
	Key              string   `json:"key"`
	Route            string   `json:"route"`
	Model            string   `json:"model"`
	Endpoint         string   `json:"endpoint"`
	Worker           string   `json:"worker"`
	Status           int      `json:"status"`
	Attempts         int      `json:"attempts"`
	TTFTMs           *float64 `json:"ttft_ms,omitempty"`
	DurationMs       float64  `json:"duration_ms"`
	PromptTokens     *int64   `json:"prompt_tokens,omitempty"`
	CompletionTokens *int64   `json:"completion_tokens,omitempty"`
	Stream           bool     `json:"stream"`
	Outcome          string   `json:"outcome"`
}

func stdJSON(t testing.TB, r *Record) []byte {
	l := stdLine{
		Time: r.Time.UTC().Format(timeLayout), RequestID: r.RequestID, TraceID: r.TraceID, Key: r.Key,
		Route: r.Route, Model: r.Model, Endpoint: r.Endpoint, Worker: r.Worker, Status: r.Status,
		Attempts: r.Attempts, DurationMs: Millis(r.Duration), Stream: r.Stream, Outcome: r.Outcome,
	}
	if r.TTFT != 0 {
		v := Millis(r.TTFT)
		l.TTFTMs = &v
	}
	if r.PromptTokens >= 0 {
		l.PromptTokens = &r.PromptTokens
	}
	if r.CompletionTokens >= 0 {
		l.CompletionTokens = &r.CompletionTokens
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(&l); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

func sampleRecord() Record {
	return Record{
		Time:      time.Date(2025, 1, 2, 3, 4, 5, 678_900_000, time.FixedZone("CET", 3600)),
		RequestID: "req-1", TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Key: "ops",
		Route: "smol", Model: "smol-v3", Endpoint: "chat", Worker: "w1", Status: 200, Attempts: 1,
		TTFT: 12500 * time.Microsecond, Duration: 48250*time.Microsecond + 999, PromptTokens: 100, CompletionTokens: 8,
		Stream: true, Outcome: "ok",
	}
}

// TestAppendJSON: the documented line, field for field; optional fields left out when unknown.
func TestAppendJSON(t *testing.T) {
	r := sampleRecord()
	want := `{"time":"2025-01-02T02:04:05.678Z","request_id":"req-1","trace_id":"4bf92f3577b34da6a3ce929d0e0e4736",` +
		`"key":"ops","route":"smol","model":"smol-v3","endpoint":"chat","worker":"w1","status":200,` +
		`"attempts":1,"ttft_ms":12.5,"duration_ms":48.25,"prompt_tokens":100,"completion_tokens":8,` +
		`"stream":true,"outcome":"ok"}`
	if got := string(AppendJSON(nil, &r)); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	r = Record{Time: time.Unix(0, 0), Status: 499, PromptTokens: -1, CompletionTokens: -1, Outcome: "client_gone",
		RequestID: "a\"b\\c\n<&>\u2028\xff"}
	want = `{"time":"1970-01-01T00:00:00.000Z","request_id":"a\"b\\c\n<&>\u2028\ufffd","trace_id":"","key":"","route":"",` +
		`"model":"","endpoint":"","worker":"","status":499,"attempts":0,"duration_ms":0,"stream":false,"outcome":"client_gone"}`
	if got := string(AppendJSON(nil, &r)); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

// FuzzAppendJSON holds the hand-written encoder to encoding/json: the same bytes for any
// strings (any bytes, valid UTF-8 or not), durations and counts, and a line that decodes to
// the same values.
func FuzzAppendJSON(f *testing.F) {
	f.Add("req-1", "4bf92f3577b34da6a3ce929d0e0e4736", "ops", "smol", "smol-v3", "w1", "ok", int64(12_500_000), int64(48_250_999), int64(100), int64(8), 200, true)
	f.Add("a\"b\\c\n\t\r\b\f\x00\x1f\x7f<&>", "", "key-0", "é\u2028\u2029", "\xff\xfe", "pool/10.0.0.1:8000", "", int64(0), int64(-5), int64(-1), int64(0), 499, false)
	f.Add(strings.Repeat("x", 128), "\xed\xa0\x80", "\xf0\x9f\x98", "日本", "\U0001F600", "", "crashed", int64(1), int64(1<<62), int64(1<<62), int64(-1), 0, true)
	f.Fuzz(func(t *testing.T, id, trace, key, route, model, worker, outcome string, ttft, dur, pt, ct int64, status int, stream bool) {
		r := Record{Time: time.Unix(0, dur).Add(time.Duration(ttft)), RequestID: id, TraceID: trace, Key: key, Route: route,
			Model: model, Endpoint: "completions", Worker: worker, Status: status, Attempts: int(pt & 7),
			TTFT: time.Duration(ttft), Duration: time.Duration(dur), PromptTokens: pt, CompletionTokens: ct,
			Stream: stream, Outcome: outcome}
		got := AppendJSON(nil, &r)
		if want := stdJSON(t, &r); !bytes.Equal(got, want) {
			t.Fatalf("AppendJSON:    %s\nencoding/json: %s", got, want)
		}
		var back map[string]any
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("not JSON: %v: %s", err, got)
		}
		if utf8.ValidString(id) && back["request_id"] != id {
			t.Fatalf("request_id %q came back as %q", id, back["request_id"])
		}
		if bytes.ContainsAny(got, "\n\r") {
			t.Fatalf("a line holds a line break: %q", got)
		}
	})
}

// BenchmarkEncode is the writer's cost per record: the hand-written encoder beside
// encoding/json of the same line.
func BenchmarkEncode(b *testing.B) {
	r := sampleRecord()
	r.RequestID = "req-" + strings.Repeat("A", 26)
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for i := 0; i < b.N; i++ {
			buf = AppendJSON(buf[:0], &r)
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		for i := 0; i < b.N; i++ {
			buf.Reset()
			l := stdLine{
				Time: r.Time.UTC().Format(timeLayout), RequestID: r.RequestID, TraceID: r.TraceID, Key: r.Key,
				Route: r.Route, Model: r.Model, Endpoint: r.Endpoint, Worker: r.Worker, Status: r.Status,
				Attempts: r.Attempts, DurationMs: Millis(r.Duration), Stream: r.Stream, Outcome: r.Outcome,
			}
			v := Millis(r.TTFT)
			l.TTFTMs, l.PromptTokens, l.CompletionTokens = &v, &r.PromptTokens, &r.CompletionTokens
			if err := enc.Encode(&l); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkRecord is what a request pays to hand its record over, the writer draining into
// io.Discard meanwhile: "handover" waits (off the clock) for the writer to empty the buffer
// every 4,096 records, so none is dropped; "flood" hands records over as fast as it can, and
// reports what share was dropped and how many lines a second the writer kept up with.
func BenchmarkRecord(b *testing.B) {
	r := sampleRecord()
	b.Run("handover", func(b *testing.B) {
		l := New(io.Discard, nil, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if i%4096 == 0 {
				b.StopTimer()
				deadline := time.Now().Add(5 * time.Second)
				for len(l.records) > 0 && time.Now().Before(deadline) {
					runtime.Gosched()
				}
				b.StartTimer()
			}
			l.Record(&r)
		}
		b.StopTimer()
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
		if d := testutil.ToFloat64(l.dropped); d != 0 {
			b.Fatalf("%v dropped", d)
		}
	})
	b.Run("flood", func(b *testing.B) {
		l := New(io.Discard, nil, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			l.Record(&r)
		}
		elapsed := b.Elapsed()
		b.StopTimer()
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
		dropped := testutil.ToFloat64(l.dropped)
		b.ReportMetric(dropped/float64(b.N), "dropped/op")
		b.ReportMetric((float64(b.N)-dropped)/elapsed.Seconds(), "lines/s")
	})
}
