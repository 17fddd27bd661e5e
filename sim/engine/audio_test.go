package engine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"strings"
	"testing"
)

func transcribe(t *testing.T, e *Engine, path string, file []byte, fields ...string) (int, string, []byte) {
	t.Helper()
	ct, form := audioForm(t, file, fields...)
	resp, b := send(t, e, "POST", path, ct, form)
	return resp.StatusCode, resp.Header.Get("Content-Type"), b
}

// TestAudioIsDeterministicFromTheFile: the same file reads the same text on any engine, another
// file another; text answers text/plain with that text, verbose_json carries it with its task;
// a streamed answer is vLLM's transcription.chunk deltas of the same text ending in [DONE].
func TestAudioIsDeterministicFromTheFile(t *testing.T) {
	e, other := start(t, Config{}), start(t, Config{ID: "e2"})
	file := bytes.Repeat([]byte("pcm!"), 4096)
	text := func(e *Engine, f []byte) string {
		code, _, b := transcribe(t, e, "/v1/audio/transcriptions", f, "model", "smol")
		var v struct {
			Text  string
			Usage struct {
				Type    string
				Seconds int
			}
		}
		if code != 200 || json.Unmarshal(b, &v) != nil || v.Text == "" || v.Usage.Type != "duration" || v.Usage.Seconds != 1 {
			t.Fatalf("transcription: %d %s", code, b)
		}
		return v.Text
	}
	got := text(e, file)
	if text(other, file) != got || text(e, append(bytes.Clone(file), 'x')) == got {
		t.Fatal("the text must follow the file's bytes, on every engine")
	}
	if code, ct, b := transcribe(t, e, "/v1/audio/transcriptions", file, "model", "smol", "response_format", "text"); code != 200 || !strings.HasPrefix(ct, "text/plain") || string(b) != got {
		t.Fatalf("text format: %d %s %q, want %q", code, ct, b, got)
	}
	_, _, b := transcribe(t, e, "/v1/audio/translations", file, "model", "smol", "response_format", "verbose_json")
	var vj struct {
		Task, Text string
		Segments   []struct{ Text string }
	}
	if json.Unmarshal(b, &vj) != nil || vj.Task != "translate" || len(vj.Segments) != 1 || vj.Segments[0].Text != vj.Text {
		t.Fatalf("verbose_json: %s", b)
	}
	_, _, b = transcribe(t, e, "/v1/audio/transcriptions", file, "model", "smol", "stream", "true", "stream_include_usage", "true")
	evs := sseEvents(b)
	var streamed strings.Builder
	for _, ev := range evs[:len(evs)-1] {
		var c struct {
			Object  string
			Choices []struct{ Delta struct{ Content string } }
		}
		if json.Unmarshal([]byte(ev.data), &c) != nil || c.Object != "transcription.chunk" {
			t.Fatalf("chunk %s", ev.data)
		}
		for _, ch := range c.Choices {
			streamed.WriteString(ch.Delta.Content)
		}
	}
	if evs[len(evs)-1].data != "[DONE]" || streamed.String() != got || !strings.Contains(evs[len(evs)-2].data, `"usage"`) {
		t.Fatalf("stream %q ends %q, want %q", streamed.String(), evs[len(evs)-1].data, got)
	}
}

// TestAudioFormIsBounded: a form without a file or a model, an empty file, an unknown format,
// too many parts, a field over its bound, a field given twice, a body over 25 MiB and a body
// that is not multipart are refused with a clear 4xx before any work.
func TestAudioFormIsBounded(t *testing.T) {
	e := start(t, Config{})
	path := "/v1/audio/transcriptions"
	var many bytes.Buffer
	mw := multipart.NewWriter(&many)
	for i := range maxAudioParts + 1 {
		_ = mw.WriteField(fmt.Sprintf("f%d", i), "v")
	}
	_ = mw.Close()
	cases := []struct {
		name, ct string
		body     []byte
		status   int
	}{
		{"too many parts", mw.FormDataContentType(), many.Bytes(), 400},
		{"not multipart", "application/json", []byte(`{"model":"smol"}`), 400},
		{"over 25 MiB", "multipart/form-data; boundary=x", make([]byte, maxAudioBody+1), 413},
	}
	for _, c := range []struct {
		name   string
		file   []byte
		fields []string
	}{
		{"no model", []byte("a"), nil},
		{"empty file", nil, []string{"model", "smol"}},
		{"unknown format", []byte("a"), []string{"model", "smol", "response_format", "srt"}},
		{"long field", []byte("a"), []string{"model", "smol", "prompt", strings.Repeat("p", maxFormField+1)}},
		{"twice", []byte("a"), []string{"model", "smol", "model", "smol"}},
		{"bad stream", []byte("a"), []string{"model", "smol", "stream", "maybe"}},
	} {
		ct, form := audioForm(t, c.file, c.fields...)
		cases = append(cases, struct {
			name, ct string
			body     []byte
			status   int
		}{c.name, ct, form, 400})
	}
	for _, c := range cases {
		if resp, b := send(t, e, "POST", path, c.ct, c.body); resp.StatusCode != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, resp.StatusCode, b, c.status)
		}
	}
	if st := e.Status(); st.Running != 0 || st.QueueDepth != 0 {
		t.Fatalf("refused forms left state: %+v", st)
	}
}
