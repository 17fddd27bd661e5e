package cascade

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
)

func TestParseAcceptIf(t *testing.T) {
	good := []struct {
		in   string
		want Accept
		str  string
	}{
		{"mean_logprob > -1.2", Accept{MeanLogprob, Greater, -1.2}, "mean_logprob > -1.2"},
		{"mean_logprob >= -1.2", Accept{MeanLogprob, GreaterEq, -1.2}, "mean_logprob >= -1.2"},
		{"min_logprob > -3", Accept{MinLogprob, Greater, -3}, "min_logprob > -3"},
		{"min_logprob >= 0", Accept{MinLogprob, GreaterEq, 0}, "min_logprob >= 0"},
		{"min_logprob>=0.5", Accept{MinLogprob, GreaterEq, 0.5}, "min_logprob >= 0.5"},
		{"mean_logprob>-1e-3", Accept{MeanLogprob, Greater, -1e-3}, "mean_logprob > -0.001"},
		{"mean_logprob > +2.5E2", Accept{MeanLogprob, Greater, 250}, "mean_logprob > 250"},
		{"mean_logprob > 1e21", Accept{MeanLogprob, Greater, 1e21}, "mean_logprob > 1e+21"},
		{"mean_logprob > .5", Accept{MeanLogprob, Greater, 0.5}, "mean_logprob > 0.5"},
		{"  \tmean_logprob   >=\t -0.25  \n", Accept{MeanLogprob, GreaterEq, -0.25}, "mean_logprob >= -0.25"},
	}
	for _, tc := range good {
		got, err := ParseAcceptIf(tc.in)
		if err != nil {
			t.Errorf("ParseAcceptIf(%q): unexpected error %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseAcceptIf(%q) = %+v, want %+v", tc.in, got, tc.want)
		}
		if s := got.String(); s != tc.str {
			t.Errorf("ParseAcceptIf(%q).String() = %q, want %q", tc.in, s, tc.str)
		}
		again, err := ParseAcceptIf(got.String())
		if err != nil || again != got {
			t.Errorf("re-parse of %q = %+v, %v; want %+v", got.String(), again, err, got)
		}
	}

	bad := []struct {
		in      string
		wantMsg string // a fragment of the error message
	}{
		{"", "empty"},
		{"   ", "empty"},
		{"max_logprob > 1", `unknown metric "max_logprob"`},
		{"MEAN_LOGPROB > 1", `unknown metric "MEAN_LOGPROB"`},
		{"mean_logprobs > 1", `unknown metric "mean_logprobs"`},
		{"> -1", "want a metric"},
		{"mean_logprob < -1", "want > or >="},
		{"mean_logprob = -1", "want > or >="},
		{"mean_logprob => -1", "want > or >="},
		{"mean_logprob == -1", "want > or >="},
		{"mean_logprob > = -1", "want a finite number"},
		{"mean_logprob", "missing operator"},
		{"mean_logprob >", "missing number"},
		{"min_logprob >=   ", "missing number"},
		{"mean_logprob > -1.2 nats", `unexpected "nats"`},
		{"mean_logprob > -1.2;", "want a finite number"},
		{"mean_logprob > NaN", "want a finite number"},
		{"mean_logprob > nan", "want a finite number"},
		{"mean_logprob > Inf", "want a finite number"},
		{"mean_logprob > -inf", "want a finite number"},
		{"mean_logprob > 1e400", "want a finite number"},
		{"mean_logprob > 1 2", `unexpected "2"`},
		{"mean_logprob > abc", "want a finite number"},
		{"mean_logprob > -1 and min_logprob > -2", "unexpected"},
	}
	for _, tc := range bad {
		got, err := ParseAcceptIf(tc.in)
		if err == nil {
			t.Errorf("ParseAcceptIf(%q) = %+v, want an error", tc.in, got)
			continue
		}
		var se *SyntaxError
		if !errors.As(err, &se) || se.Input != tc.in {
			t.Errorf("ParseAcceptIf(%q): error %v is not a *SyntaxError for the input", tc.in, err)
		}
		msg := err.Error()
		if !strings.Contains(msg, tc.wantMsg) {
			t.Errorf("ParseAcceptIf(%q) error %q does not contain %q", tc.in, msg, tc.wantMsg)
		}
		if prefix := "accept_if " + strconv.Quote(tc.in) + ": "; !strings.HasPrefix(msg, prefix) {
			t.Errorf("ParseAcceptIf(%q) error %q does not start with %q", tc.in, msg, prefix)
		}
		if got != (Accept{}) {
			t.Errorf("ParseAcceptIf(%q) returned %+v alongside an error", tc.in, got)
		}
	}

	holds := []struct {
		rule     string
		logprobs []float64
		want     bool
	}{
		// > is strict, >= is not: the boundary value separates them.
		{"mean_logprob > -1", []float64{-1, -1}, false},
		{"mean_logprob >= -1", []float64{-1, -1}, true},
		{"min_logprob > -2", []float64{-2, 0}, false},
		{"min_logprob >= -2", []float64{-2, 0}, true},
		// min and mean differ on the same answer.
		{"mean_logprob > -1.5", []float64{-0.1, -0.1, -3}, true},
		{"min_logprob > -1.5", []float64{-0.1, -0.1, -3}, false},
		{"mean_logprob > -0.5", []float64{-0.4}, true},
		// An answer with no tokens is never accepted.
		{"mean_logprob > -100", nil, false},
		{"min_logprob >= -100", []float64{}, false},
		// Nor is one whose logprobs are not numbers.
		{"min_logprob > -100", []float64{-1, math.NaN()}, false},
		{"mean_logprob > -100", []float64{math.NaN()}, false},
		// A token of probability zero sinks both metrics.
		{"min_logprob > -100", []float64{-1, math.Inf(-1)}, false},
		{"mean_logprob > -100", []float64{-1, math.Inf(-1)}, false},
	}
	for _, tc := range holds {
		a, err := ParseAcceptIf(tc.rule)
		if err != nil {
			t.Fatalf("ParseAcceptIf(%q): %v", tc.rule, err)
		}
		if got := a.Holds(tc.logprobs); got != tc.want {
			t.Errorf("%q.Holds(%v) = %v, want %v", tc.rule, tc.logprobs, got, tc.want)
		}
	}

	if (Accept{}).Holds([]float64{0}) {
		t.Error("the zero Accept holds; want never")
	}
}

func FuzzParseAcceptIf(f *testing.F) {
	for _, s := range []string{
		"mean_logprob > -1.2", "min_logprob >= 0", "mean_logprob>=-1e-3", " min_logprob > +5 ",
		"", "mean_logprob", "mean_logprob >", "mean_logprob < 1", "mean_logprob => 1",
		"mean_logprob > NaN", "mean_logprob > 1 2", "min_logprob >= 0x1p-2", "mean_logprob > -0",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAcceptIf(s)
		if err != nil {
			if a != (Accept{}) {
				t.Fatalf("ParseAcceptIf(%q) returned %+v alongside error %v", s, a, err)
			}
			return
		}
		if math.IsNaN(a.Threshold) || math.IsInf(a.Threshold, 0) {
			t.Fatalf("ParseAcceptIf(%q) accepted a non-finite threshold %v", s, a.Threshold)
		}
		canon := a.String()
		b, err := ParseAcceptIf(canon)
		if err != nil {
			t.Fatalf("canonical form %q of %q does not parse: %v", canon, s, err)
		}
		if b != a {
			t.Fatalf("ParseAcceptIf(%q) = %+v, but its canonical form %q parses to %+v", s, a, canon, b)
		}
		if b.String() != canon {
			t.Fatalf("canonical form is not stable: %q then %q", canon, b.String())
		}
	})
}
