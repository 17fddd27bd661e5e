package request

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// tokenizeAnswer is a tokenize answer of n ids, each written as id (its digits set the size).
func tokenizeAnswer(n int, id uint32) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `{"count":%d,"max_model_len":32768,"tokens":[`, n)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, id)
	}
	b.WriteString("]}")
	return b.Bytes()
}

// TestTokenizeAnswerBounded: a prefill worker's tokenize answer is bounded by the request it
// answers: at most maxTokenIDs(len(body)) ids (one a byte, and a chat template's), read up to
// maxTokenizeAnswer of that many bytes whatever its Content-Length says; beyond either, the
// call fails (the prefill worker's failure) instead of holding the ids.
func TestTokenizeAnswerBounded(t *testing.T) {
	body := []byte(`{"model":"smol","prompt":"` + strings.Repeat("word ", 40) + `"}`)
	most := maxTokenIDs(len(body))
	if most != len(body)+templateTokens {
		t.Fatalf("maxTokenIDs(%d) = %d", len(body), most)
	}
	for _, c := range []struct {
		name   string
		answer []byte
		length int64 // the Content-Length the engine claims (-1: none)
		err    string
	}{
		{"a few ids", tokenizeAnswer(40, 7), -1, ""},
		{"the most ids, each as long as an id gets", tokenizeAnswer(most, 4294967295), -1, ""},
		{"one id too many", tokenizeAnswer(most+1, 7), -1, "token ids for a"},
		{"too many bytes", append(tokenizeAnswer(3, 7)[:1], bytes.Repeat([]byte(" "), maxTokenizeAnswer(most))...), -1, "bytes for a"},
		{"too many bytes, under a small Content-Length", tokenizeAnswer(most+2000, 4294967295), 10, "bytes for a"},
	} {
		t.Run(c.name, func(t *testing.T) {
			up := upstreamFunc(func(req *http.Request) (*http.Response, error) {
				if got, _ := io.ReadAll(req.Body); !bytes.Equal(got, body) {
					t.Errorf("sent %q", got)
				}
				return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
					ContentLength: c.length, Body: io.NopCloser(bytes.NewReader(c.answer))}, nil
			})
			res := tokenizeCall(context.Background(), up, "http://p/v1/tokenize", body, traceHeader{})
			switch {
			case c.err == "" && (res.err != nil || len(res.ids) == 0):
				t.Fatalf("%d ids, %v; want the ids", len(res.ids), res.err)
			case c.err != "" && (res.err == nil || !strings.Contains(res.err.Error(), c.err) || res.ids != nil):
				t.Fatalf("%d ids, %v; want an error with %q and no ids", len(res.ids), res.err, c.err)
			}
		})
	}
}
