// Package cascade holds the plain-Go parts of model cascades (R7) that more
// than one user needs: the accept_if rule that decides whether a step's
// answer is kept, the offline threshold sweep (cost and quality curve) over
// an evaluation fixture, and reading logprobs and text out of OpenAI
// response bodies.
package cascade

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
)

// Metric is the statistic of an answer's token logprobs that accept_if tests.
type Metric int

const (
	// MeanLogprob is the arithmetic mean of the answer's token logprobs.
	MeanLogprob Metric = iota + 1
	// MinLogprob is the smallest of the answer's token logprobs.
	MinLogprob
)

// String returns the metric's accept_if spelling.
func (m Metric) String() string {
	switch m {
	case MeanLogprob:
		return "mean_logprob"
	case MinLogprob:
		return "min_logprob"
	}
	return "Metric(" + strconv.Itoa(int(m)) + ")"
}

// Op is the comparison of an accept_if rule.
type Op int

const (
	// Greater holds when the metric is strictly above the threshold.
	Greater Op = iota + 1
	// GreaterEq holds when the metric is at or above the threshold.
	GreaterEq
)

// String returns the operator's accept_if spelling.
func (o Op) String() string {
	switch o {
	case Greater:
		return ">"
	case GreaterEq:
		return ">="
	}
	return "Op(" + strconv.Itoa(int(o)) + ")"
}

// Accept is a parsed accept_if rule: Metric Op Threshold.
type Accept struct {
	Metric    Metric
	Op        Op
	Threshold float64
}

// SyntaxError reports an accept_if string that does not follow the grammar.
type SyntaxError struct {
	// Input is the string given to ParseAcceptIf.
	Input string
	// Reason says what was expected and what was found instead.
	Reason string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("accept_if %q: %s", e.Input, e.Reason)
}

// ParseAcceptIf parses an accept_if rule with the grammar
//
//	(mean_logprob | min_logprob) (> | >=) FLOAT
//
// Whitespace around the tokens is optional. FLOAT is anything
// strconv.ParseFloat accepts as a finite float64 (NaN and infinities are
// rejected). Errors are *SyntaxError.
func ParseAcceptIf(s string) (Accept, error) {
	fail := func(format string, args ...any) (Accept, error) {
		return Accept{}, &SyntaxError{Input: s, Reason: fmt.Sprintf(format, args...)}
	}
	rest := skipSpace(s)
	if rest == "" {
		return fail("empty; want e.g. \"mean_logprob > -1.2\"")
	}

	// Metric: a run of identifier characters.
	n := strings.IndexFunc(rest, func(r rune) bool {
		return !(r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r))
	})
	if n < 0 {
		n = len(rest)
	}
	var a Accept
	switch word := rest[:n]; word {
	case "mean_logprob":
		a.Metric = MeanLogprob
	case "min_logprob":
		a.Metric = MinLogprob
	case "":
		return fail("want a metric (mean_logprob or min_logprob) at the start, got %q", rest)
	default:
		return fail("unknown metric %q; want mean_logprob or min_logprob", word)
	}
	rest = skipSpace(rest[n:])

	// Operator.
	switch {
	case strings.HasPrefix(rest, ">="):
		a.Op, rest = GreaterEq, rest[2:]
	case strings.HasPrefix(rest, ">"):
		a.Op, rest = Greater, rest[1:]
	case rest == "":
		return fail("missing operator after %s; want > or >=", a.Metric)
	default:
		return fail("want > or >= after %s, got %q", a.Metric, rest)
	}
	rest = skipSpace(rest)

	// Threshold: one token, then nothing but whitespace.
	if rest == "" {
		return fail("missing number after %s %s", a.Metric, a.Op)
	}
	n = strings.IndexFunc(rest, unicode.IsSpace)
	if n < 0 {
		n = len(rest)
	}
	num := rest[:n]
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return fail("want a finite number after %s %s, got %q", a.Metric, a.Op, num)
	}
	if trailing := skipSpace(rest[n:]); trailing != "" {
		return fail("unexpected %q after the number", trailing)
	}
	a.Threshold = f
	return a, nil
}

func skipSpace(s string) string { return strings.TrimLeftFunc(s, unicode.IsSpace) }

// String returns the rule's canonical form, e.g. "mean_logprob > -1.2";
// ParseAcceptIf(a.String()) returns a again.
func (a Accept) String() string {
	return a.Metric.String() + " " + a.Op.String() + " " + strconv.FormatFloat(a.Threshold, 'g', -1, 64)
}

// Holds reports whether an answer with these per-token logprobs is kept.
// An answer with no tokens, or with a NaN logprob, is never kept.
func (a Accept) Holds(logprobs []float64) bool {
	if len(logprobs) == 0 {
		return false
	}
	var v float64
	switch a.Metric {
	case MeanLogprob:
		sum := 0.0
		for _, lp := range logprobs {
			sum += lp
		}
		v = sum / float64(len(logprobs))
	case MinLogprob:
		v = math.Inf(1)
		for _, lp := range logprobs {
			v = math.Min(v, lp)
		}
	default:
		return false
	}
	if math.IsNaN(v) {
		return false
	}
	switch a.Op {
	case Greater:
		return v > a.Threshold
	case GreaterEq:
		return v >= a.Threshold
	}
	return false
}
