package scrape

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// largeVLLMPage is vLLM's page as a busy engine serves it: the fixture plus 40 histograms of
// 20 buckets for each of two data-parallel ranks (about 160 KB).
func largeVLLMPage(tb testing.TB) []byte {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "vllm_v1.txt"))
	if err != nil {
		tb.Fatal(err)
	}
	var sb strings.Builder
	sb.Write(b)
	for h := range 40 {
		name := fmt.Sprintf("vllm:histogram_%02d_seconds", h)
		fmt.Fprintf(&sb, "# HELP %s A latency histogram.\n# TYPE %s histogram\n", name, name)
		for engine := range 2 {
			for i := range 20 {
				fmt.Fprintf(&sb, "%s_bucket{engine=\"%d\",le=\"%g\",model_name=%q} %d.0\n", name, engine, 0.001*float64(int(1)<<i), llama, 100*i)
			}
			fmt.Fprintf(&sb, "%s_bucket{engine=\"%d\",le=\"+Inf\",model_name=%q} 2000.0\n", name, engine, llama)
			fmt.Fprintf(&sb, "%s_count{engine=\"%d\",model_name=%q} 2000.0\n%s_sum{engine=\"%d\",model_name=%q} 123.5\n", name, engine, llama, name, engine, llama)
		}
	}
	return []byte(sb.String())
}

// hostilePage is a page at the body limit made of lines of one shape (%d: the line's number).
func hostilePage(shape string) []byte {
	var b []byte
	for i := 0; ; i++ {
		line := fmt.Sprintf(shape, i)
		if len(b)+len(line) > MaxBodyBytes {
			return b
		}
		b = append(b, line...)
	}
}

func BenchmarkParse(b *testing.B) {
	for _, c := range []struct {
		name string
		page []byte
	}{
		{"vllm_large", largeVLLMPage(b)},
		{"hostile_other_family", hostilePage("a{b=\"%d\"} 1\n")},
		{"hostile_needed_family", hostilePage("vllm:num_requests_waiting{x=\"%d\"} 1\n")},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.page)))
			for b.Loop() {
				_, _ = Parse(VLLM, llama, c.page, 100)
			}
		})
	}
}
