package scrape

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
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

// TestFamilyPieces pins how readLoRAInfo bounds its parse: the family's sample lines — and
// only they: not its comments, not another family's lines, not a longer family's that begins
// with its name — reach the parser whole and in order, in pieces of at most the limit, each
// as full as the next line allows; a line of exactly the limit is read, one byte more is
// too_large; and an error from the parser ends the pieces.
func TestFamilyPieces(t *testing.T) {
	const name, limit = "fam", 40
	sample := func(i, pad int) string {
		return fmt.Sprintf("fam{i=\"%d\",p=\"%s\"} %d\n", i, strings.Repeat("x", pad), i)
	}
	var want []string
	var pg strings.Builder
	pg.WriteString("# HELP fam Help.\n# TYPE fam gauge\n\n")
	for i := range 12 {
		line := sample(i, i%5*4)
		want = append(want, line)
		pg.WriteString(line)
		pg.WriteString("famine 1\nother{a=\"fam\"} 2\n  # a comment\n\n")
	}
	pg.WriteString(`{"fam",i="q"} 7`) // the quoted form, no final newline
	want = append(want, `{"fam",i="q"} 7`)

	var pieces []string
	err := familyPieces([]byte(pg.String()), name, limit, func(p []byte) error {
		pieces = append(pieces, string(p))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(pieces, ""); got != strings.Join(want, "") {
		t.Fatalf("pieces %q, want the lines %q", pieces, want)
	}
	for i, p := range pieces {
		if len(p) > limit {
			t.Fatalf("piece %d is %d bytes, over %d", i, len(p), limit)
		}
		if i+1 < len(pieces) {
			next := strings.SplitAfter(pieces[i+1], "\n")[0]
			if len(p)+len(next) <= limit {
				t.Fatalf("piece %d (%d bytes) had room for the next line (%d bytes)", i, len(p), len(next))
			}
		}
	}

	exact := sample(1, limit-len(sample(1, 0)))
	if len(exact) != limit {
		t.Fatalf("a line of %d bytes", len(exact))
	}
	pieces = nil
	if err := familyPieces([]byte(exact+exact), name, limit, func(p []byte) error {
		pieces = append(pieces, string(p))
		return nil
	}); err != nil || len(pieces) != 2 {
		t.Fatalf("two lines of exactly the limit: %q, %v", pieces, err)
	}
	half := sample(1, limit/2-len(sample(1, 0)))
	pieces = nil
	if err := familyPieces([]byte(half+half), name, limit, func(p []byte) error {
		pieces = append(pieces, string(p))
		return nil
	}); err != nil || len(pieces) != 1 {
		t.Fatalf("two lines of half the limit: %q, %v; want one piece", pieces, err)
	}
	over := sample(1, limit+1-len(sample(1, 0)))
	if err := familyPieces([]byte(exact+over), name, limit, func([]byte) error { return nil }); reasonOf(err) != ReasonTooLarge {
		t.Fatalf("a line over the limit: %v", err)
	}
	// A page without the family (an engine without LoRA, the common case) parses nothing.
	calls := 0
	if err := familyPieces([]byte("famine 1\n# TYPE fam gauge\nother 2\n"), name, limit, func([]byte) error { calls++; return nil }); err != nil || calls != 0 {
		t.Fatalf("a page without the family: %v, %d calls", err, calls)
	}
	stop := failf(ReasonParse, "stop")
	if err := familyPieces([]byte(exact+exact+exact), name, limit, func([]byte) error { calls++; return stop }); err != stop || calls != 1 {
		t.Fatalf("after an error: %v, %d calls", err, calls)
	}
}
