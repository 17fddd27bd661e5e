package scrape

import (
	"bytes"
	"strings"
)

// MaxReadBytes bounds the part of a page that expfmt parses: the lines of the families a
// dialect reads. expfmt holds a parsed page in about 28 times its size (4 MiB of short series
// took 119 MB and 0.26 s), and a page may carry anything up to MaxBodyBytes: an engine that
// exports a series per request, or one that is not an engine. The families a dialect reads
// are a few gauges with a series per model and engine rank, a few KiB on any real page.
const MaxReadBytes = 256 << 10

// keepFamilies returns the lines of page that belong to the families named: their samples
// and their # HELP and # TYPE lines (a family counts as named when a name is a prefix of it, so
// a histogram's _bucket, _sum and _count lines stay with it). A line that surely belongs to
// another family, a plain comment and a blank line go; a line it cannot tell apart (not a
// sample or a comment of the text format, a name that is not plain) stays, so a page that is
// not a metrics page still fails as malformed. What stays is bounded by MaxReadBytes
// (ReasonTooLarge).
func keepFamilies(page []byte, names []string) ([]byte, error) {
	out := make([]byte, 0, min(len(page), 4096))
	var err error
	eachLine(page, names, func(line []byte, keep bool) bool {
		if !keep {
			return true
		}
		if len(out)+len(line) > MaxReadBytes {
			err = failf(ReasonTooLarge, "over %d bytes of the page are series of %s or lines that are not metrics", MaxReadBytes, strings.Join(names, ", "))
			return false
		}
		out = append(out, line...)
		return true
	})
	return out, err
}

// pageLine is the number in page of the nth line keepFamilies keeps (a line past the last
// one kept counts on from the page's end), for a parse error to name the page's own line.
func pageLine(page []byte, names []string, n int) int {
	at, kept := 0, 0
	eachLine(page, names, func(_ []byte, keep bool) bool {
		at++
		if keep {
			kept++
		}
		return kept < n
	})
	return at + max(n-kept, 0)
}

// eachLine calls f with each line of page (its '\n' included) and whether keepFamilies keeps
// it, until f returns false.
func eachLine(page []byte, names []string, f func(line []byte, keep bool) bool) {
	lines(page, func(line []byte) bool {
		name, ok := lineFamily(line)
		return f(line, !ok || named(name, names))
	})
}

// lines calls f with each line of page, its '\n' included, until f returns false.
func lines(page []byte, f func(line []byte) bool) {
	for rest := page; len(rest) > 0; {
		line := rest
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i+1], rest[i+1:]
		} else {
			rest = nil
		}
		if !f(line) {
			return
		}
	}
}

// named reports whether family is one of names or begins with one.
func named(family []byte, names []string) bool {
	for _, n := range names {
		if len(family) >= len(n) && string(family[:len(n)]) == n {
			return true
		}
	}
	return false
}

// lineFamily is the family a line of the text format surely belongs to: a sample's metric
// name, or the name a # HELP or # TYPE line describes. A plain comment and a blank line belong
// to none and may go (ok with an empty name); a line it cannot read is not ok (keep it).
func lineFamily(line []byte) (name []byte, ok bool) {
	line = bytes.TrimLeft(line, " \t")
	if len(line) == 0 || line[0] == '\n' {
		return nil, true
	}
	if line[0] != '#' {
		// A sample: name{…} value, name value, or {"name",…} value.
		return sampleName(line)
	}
	line = bytes.TrimLeft(line[1:], " \t")
	word := line[:wordEnd(line)]
	if string(word) != "HELP" && string(word) != "TYPE" {
		return nil, true // a plain comment: expfmt skips it
	}
	line = bytes.TrimLeft(line[len(word):], " \t")
	if len(line) > 0 && line[0] == '"' {
		n, after, ok := quoted(line)
		if !ok || (len(after) > 0 && after[0] != ' ' && after[0] != '\t' && after[0] != '\n') {
			return nil, false
		}
		return n, true
	}
	n := line[:plainNameEnd(line)]
	if len(n) == 0 || (len(n) < len(line) && line[len(n)] != ' ' && line[len(n)] != '\t' && line[len(n)] != '\n') {
		return nil, false
	}
	return n, true
}

// sampleName reads a sample line's metric name.
func sampleName(line []byte) ([]byte, bool) {
	if line[0] == '{' {
		line = bytes.TrimLeft(line[1:], " \t")
		if len(line) == 0 || line[0] != '"' {
			return nil, false
		}
		n, after, ok := quoted(line)
		after = bytes.TrimLeft(after, " \t")
		if !ok || len(after) == 0 || (after[0] != ',' && after[0] != '}') {
			return nil, false
		}
		return n, true
	}
	n := line[:plainNameEnd(line)]
	if len(n) == 0 || len(n) == len(line) {
		return nil, false
	}
	if c := line[len(n)]; c != '{' && c != ' ' && c != '\t' {
		return nil, false
	}
	return n, true
}

// quoted reads a double-quoted name without escapes (a name with a backslash is not one a
// dialect reads, and it is kept for expfmt to judge).
func quoted(s []byte) (name, after []byte, ok bool) {
	end := bytes.IndexAny(s[1:], "\"\\")
	if end < 0 || s[1+end] != '"' {
		return nil, nil, false
	}
	return s[1 : 1+end], s[2+end:], end > 0
}

// plainNameEnd is the length of the metric name (legacy characters) s begins with.
func plainNameEnd(s []byte) int {
	for i, c := range s {
		if !(c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (i > 0 && c >= '0' && c <= '9')) {
			return i
		}
	}
	return len(s)
}

// wordEnd is the length of the token s begins with, up to a blank or the line's end.
func wordEnd(s []byte) int {
	if i := bytes.IndexAny(s, " \t\n"); i >= 0 {
		return i
	}
	return len(s)
}

// familyPieces calls f with the sample lines of page that surely belong to the family name,
// whole and in order, in pieces of at most limit bytes, each as long as the next line allows.
// Comments, # HELP and # TYPE lines are left out: a sample without its TYPE line reads as
// untyped, which keeps its value. A line over limit is an error (too_large), as is f's, and
// ends the pieces.
func familyPieces(page []byte, name string, limit int, f func(piece []byte) error) error {
	var piece []byte
	var err error
	lines(page, func(line []byte) bool {
		t := bytes.TrimLeft(line, " \t")
		// Most lines are another family's: a prefix check passes them by cheaply.
		if len(t) == 0 || (t[0] != '{' && !bytes.HasPrefix(t, []byte(name))) {
			return true
		}
		if fam, ok := lineFamily(line); !ok || string(fam) != name {
			return true
		}
		if len(line) > limit {
			err = failf(ReasonTooLarge, "%s: a sample line of %d bytes, over %d", name, len(line), limit)
			return false
		}
		if len(piece)+len(line) > limit {
			err = f(piece)
			piece = piece[:0]
		}
		piece = append(piece, line...)
		return err == nil
	})
	if err == nil && len(piece) > 0 {
		err = f(piece)
	}
	return err
}
