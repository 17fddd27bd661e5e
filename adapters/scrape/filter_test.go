package scrape

import (
	"github.com/google/go-cmp/cmp"

	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLineFamily: which lines of the text format surely belong to a family, and which are
// kept for expfmt to judge.
func TestLineFamily(t *testing.T) {
	for _, c := range []struct {
		line, name string
		ok         bool
	}{
		{"a 1\n", "a", true},
		{"a{b=\"c\"} 1\n", "a", true},
		{"  \tvllm:x_bucket{le=\"1\"} 2\n", "vllm:x_bucket", true},
		{"a\t1", "a", true},
		{"_a:b9 1\n", "_a:b9", true},
		{"zaZA:_09 1\n", "zaZA:_09", true},
		{"Za 1\n", "Za", true},
		{"{\"a.b\",c=\"d\"} 1\n", "a.b", true},
		{"{ \"a\" } 1\n", "a", true},
		{"# HELP a some text\n", "a", true},
		{"#TYPE\ta gauge\n", "a", true},
		{"# TYPE \"a.b\" gauge\n", "a.b", true},
		{"# TYPE a\n", "a", true},
		{"# HELP a\tdoc\n", "a", true},
		{"# HELP \"a.b\"\n", "a.b", true},
		{"# TYPE \"a\"", "a", true},
		{"# TYPE a", "a", true},
		{"# a plain comment\n", "", true},
		{"#\n", "", true},
		{"# HELPX a\n", "", true},
		{"\n", "", true},
		{"   \n", "", true},
		// Kept: not a line of the text format this reader can place.
		{"# HELP\n", "", false},
		{"# HELP", "", false},
		{"# TYPE  \n", "", false},
		{"# TYPE a-b gauge\n", "", false},
		{"# TYPE \"a\\\"b\" gauge\n", "", false},
		{"# TYPE \"a\"b gauge\n", "", false},
		{"# TYPE \"\" gauge\n", "", false},
		{"a", "", false},
		{"9a 1\n", "", false},
		{"a-b 1\n", "", false},
		{"<!doctype html>\n", "", false},
		{"{\"num_requests_waiting\": 3}", "", false},
		{"{\"a\\\"b\"} 1\n", "", false},
		{"{\"a\n", "", false},
		{"{a=\"b\"} 1\n", "", false},
		{"{\"a\"", "", false},
		{"\xff\xfe\n", "", false},
		{"{ab\",x=\"y\"} 1\n", "", false},
		{"{\"a\\\\\"} 1\n", "", false},
		{"{\"a\\,x=\"y\"} 1\n", "", false},
	} {
		name, ok := lineFamily([]byte(c.line))
		if string(name) != c.name || ok != c.ok {
			t.Errorf("lineFamily(%q) = %q, %v; want %q, %v", c.line, name, ok, c.name, c.ok)
		}
	}
}

// TestKeepFamilies: what expfmt is given of a page, the bound on it, and a parse error naming
// the page's own line.
func TestKeepFamilies(t *testing.T) {
	names := dialects[VLLM].names()
	pg := "# HELP other x\n# TYPE other gauge\nother 1\n# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 3\n" +
		"other_bucket{le=\"1\"} 1\nvllm:num_requests_running_total 2\n# comment\n\n<junk>\nvllm:kv_cache_usage_perc 0.5"
	got, err := keepFamilies([]byte(pg), names)
	want := "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 3\nvllm:num_requests_running_total 2\n<junk>\nvllm:kv_cache_usage_perc 0.5"
	if err != nil || string(got) != want {
		t.Fatalf("kept %q, %v; want %q", got, err, want)
	}
	for n, want := range map[int]int{1: 4, 2: 5, 3: 7, 4: 10, 5: 11, 6: 12, 8: 14} {
		if got := pageLine([]byte(pg), names, n); got != want {
			t.Errorf("kept line %d is the page's line %d, want %d", n, got, want)
		}
	}
	// A page of other families only: nothing to parse, however large.
	o := "other_series{a=\"1234567890\"} 1\n"
	other := strings.Repeat(o, MaxBodyBytes/len(o))
	if got, err := keepFamilies([]byte(other), names); err != nil || len(got) != 0 {
		t.Fatalf("other families: kept %d bytes, %v", len(got), err)
	}
	// The named families up to the bound, and one byte over it.
	line := "vllm:num_requests_waiting{x=\"1\"} 1\n"
	at := strings.Repeat(line, MaxReadBytes/len(line))
	at += "<" + strings.Repeat("x", MaxReadBytes-len(at)-2) + "\n"
	if got, err := keepFamilies([]byte(other+at), names); err != nil || len(got) != MaxReadBytes {
		t.Fatalf("at the bound: kept %d bytes, %v", len(got), err)
	}
	if _, err := keepFamilies([]byte(at+"a"), names); err == nil || reasonOf(err) != ReasonTooLarge {
		t.Fatalf("one byte over the bound: %v", err)
	}
	if _, err := Parse(VLLM, "m", []byte(at+"a"), 100); err == nil || reasonOf(err) != ReasonTooLarge {
		t.Fatalf("Parse of a page one byte over the bound: %v", err)
	}
	// A parse error names the page's line, past the lines that were not parsed.
	bad := strings.Repeat(o, 10) + "vllm:num_requests_waiting 1\n" + strings.Repeat(o, 5) + "vllm:num_requests_running{x=\"1\" 2\n"
	if _, err := Parse(VLLM, "m", []byte(bad), 100); err == nil || reasonOf(err) != ReasonParse ||
		!strings.HasPrefix(err.Error(), "malformed metrics page: text format parsing error in line 17:") {
		t.Fatalf("a bad line after others: %v", err)
	}
	if _, err := Parse(VLLM, "m", []byte(strings.Repeat(o, 3)+"vllm:num_requests_waiting{"), 100); err == nil ||
		!strings.HasPrefix(err.Error(), "malformed metrics page: text format parsing error in line 4:") {
		t.Fatalf("a page cut short after others: %v", err)
	}
}

// TestParseLargePage: a busy vLLM engine's page with 40 histograms per rank reads as its
// fixture does.
func TestParseLargePage(t *testing.T) {
	small, err := Parse(VLLM, llama, []byte(page(t, "vllm_v1.txt")), 100)
	if err != nil {
		t.Fatal(err)
	}
	large, err := Parse(VLLM, llama, largeVLLMPage(t), 100)
	if err != nil || !cmp.Equal(large, small) {
		t.Fatalf("large page %+v, %v; fixture %+v", large, err, small)
	}
}

// FuzzKeepFamilies: reading only the named families changes nothing for a page expfmt reads
// whole: Parse gives what parsing the whole page gives, for every model and for one; and what
// is kept is bounded and made of the page's lines, in order.
func FuzzKeepFamilies(f *testing.F) {
	for _, name := range []string{"vllm_v1.txt", "vllm_v0.txt", "sglang.txt", "tlengine.txt"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 1\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0\n"))
	f.Add([]byte("{\"vllm:num_requests_waiting\"} 1\nvllm:num_requests_running 1\nvllm:kv_cache_usage_perc 0\nother 1\n"))
	f.Fuzz(func(t *testing.T, page []byte) {
		for _, kind := range []Kind{VLLM, SGLang, TLEngine} {
			d := dialects[kind]
			kept, err := keepFamilies(page, d.names())
			if err != nil {
				if reasonOf(err) != ReasonTooLarge {
					t.Fatalf("%s: %v", kind, err)
				}
				continue
			}
			if len(kept) > MaxReadBytes || !subsequenceOfLines(kept, page) {
				t.Fatalf("%s: kept %q from %q", kind, kept, page)
			}
			for _, model := range []string{"", llama} {
				whole, werr := parsePage(d, model, page, 100)
				if werr != nil {
					continue
				}
				got, err := Parse(kind, model, page, 100)
				got.RunningLoRAs, got.MaxLoRAs = nil, 0 // read apart from the load (readLoRAInfo)
				if err != nil || !cmp.Equal(got, whole) {
					t.Fatalf("%s, model %q: %+v, %v; the whole page gives %+v", kind, model, got, err, whole)
				}
			}
		}
	})
}

// subsequenceOfLines reports whether kept is some of page's lines, whole and in order.
func subsequenceOfLines(kept, page []byte) bool {
	pl := strings.SplitAfter(string(page), "\n")
	for _, k := range strings.SplitAfter(string(kept), "\n") {
		if k == "" {
			continue
		}
		for len(pl) > 0 && pl[0] != k {
			pl = pl[1:]
		}
		if len(pl) == 0 {
			return false
		}
		pl = pl[1:]
	}
	return true
}
