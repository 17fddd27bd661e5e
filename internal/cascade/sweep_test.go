package cascade

import (
	"math"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func readTestFixture(t *testing.T) *Fixture {
	t.Helper()
	file, err := os.Open("testdata/cascade_sweep.json")
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	f, err := ReadFixture(file)
	if err != nil {
		t.Fatalf("ReadFixture: %v", err)
	}
	return f
}

// TestCascadeCurveMatchesFixture sweeps the fixture's 200 prompts and
// compares the curve exactly (==) with the fixture's expected points.
func TestCascadeCurveMatchesFixture(t *testing.T) {
	f := readTestFixture(t)
	if len(f.Samples) != 200 || len(f.Taus) != 13 || len(f.Expected) != 13 {
		t.Fatalf("fixture has %d samples, %d taus, %d expected points; want 200, 13, 13",
			len(f.Samples), len(f.Taus), len(f.Expected))
	}
	if f.SmallCost != 0.1 || f.AcceptIf != "mean_logprob > tau" {
		t.Fatalf("fixture small_cost %v accept_if %q; want 0.1 and \"mean_logprob > tau\"", f.SmallCost, f.AcceptIf)
	}
	rule, err := ParseAcceptTemplate(f.AcceptIf)
	if err != nil {
		t.Fatal(err)
	}
	got := CascadeCurve(f.Samples, f.Taus, f.SmallCost, rule)
	if diff := cmp.Diff(f.Expected, got); diff != "" {
		t.Errorf("curve differs from the fixture's expected (-want +got):\n%s", diff)
	}
	// A nil rule is the same default.
	if diff := cmp.Diff(got, CascadeCurve(f.Samples, f.Taus, f.SmallCost, nil)); diff != "" {
		t.Errorf("nil rule differs from mean_logprob > tau (-template +nil):\n%s", diff)
	}

	// The rows printed in the design's table, independent of the fixture's
	// own expected field.
	table := map[float64]CurvePoint{
		-3.0: {Tau: -3.0, Escalated: 0.000, Cost: 0.100, Accuracy: 0.540},
		-2.0: {Tau: -2.0, Escalated: 0.190, Cost: 0.290, Accuracy: 0.660},
		-1.0: {Tau: -1.0, Escalated: 0.640, Cost: 0.740, Accuracy: 0.865},
		-0.5: {Tau: -0.5, Escalated: 0.820, Cost: 0.920, Accuracy: 0.935},
		0.0:  {Tau: 0.0, Escalated: 1.000, Cost: 1.100, Accuracy: 0.935},
	}
	found := 0
	for _, p := range got {
		if want, ok := table[p.Tau]; ok {
			found++
			if p != want {
				t.Errorf("tau %v: got %+v, want %+v", p.Tau, p, want)
			}
		}
	}
	if found != len(table) {
		t.Errorf("found %d of the table's %d thresholds in the sweep", found, len(table))
	}
}

func TestCascadeCurveArithmetic(t *testing.T) {
	samples := []Sample{
		{ID: "a", SmallLogprobs: []float64{-0.1, -0.3}, SmallCorrect: 1, LargeCorrect: 1}, // mean -0.2, min -0.3
		{ID: "b", SmallLogprobs: []float64{-1, -3}, SmallCorrect: 0, LargeCorrect: 1},     // mean -2, min -3
		{ID: "c", SmallLogprobs: []float64{}, SmallCorrect: 1, LargeCorrect: 0},           // no tokens: never kept
		{ID: "d", SmallLogprobs: []float64{-0.5}, SmallCorrect: 0, LargeCorrect: 0},       // mean = min = -0.5
	}
	taus := []float64{-5, -2, -0.5, 0}
	tmpl := func(s string) func(float64) Accept {
		t.Helper()
		r, err := ParseAcceptTemplate(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	cases := []struct {
		name string
		rule func(float64) Accept
		want []CurvePoint
	}{
		{"mean >", tmpl("mean_logprob > tau"), []CurvePoint{
			{Tau: -5, Escalated: 0.25, Cost: 0.35, Accuracy: 0.25},  // a b d kept: 1+0+0, c escalated: 0
			{Tau: -2, Escalated: 0.5, Cost: 0.6, Accuracy: 0.5},     // b at the boundary escalates (1)
			{Tau: -0.5, Escalated: 0.75, Cost: 0.85, Accuracy: 0.5}, // d at the boundary escalates (0)
			{Tau: 0, Escalated: 1, Cost: 1.1, Accuracy: 0.5},        // all large: 1+1+0+0
		}},
		{"mean >=", tmpl("mean_logprob >= tau"), []CurvePoint{
			{Tau: -5, Escalated: 0.25, Cost: 0.35, Accuracy: 0.25},
			{Tau: -2, Escalated: 0.25, Cost: 0.35, Accuracy: 0.25},
			{Tau: -0.5, Escalated: 0.5, Cost: 0.6, Accuracy: 0.5},
			{Tau: 0, Escalated: 1, Cost: 1.1, Accuracy: 0.5},
		}},
		{"min >=", tmpl("min_logprob >= tau"), []CurvePoint{
			{Tau: -5, Escalated: 0.25, Cost: 0.35, Accuracy: 0.25},
			{Tau: -2, Escalated: 0.5, Cost: 0.6, Accuracy: 0.5},
			{Tau: -0.5, Escalated: 0.5, Cost: 0.6, Accuracy: 0.5},
			{Tau: 0, Escalated: 1, Cost: 1.1, Accuracy: 0.5},
		}},
		{"nil is mean >", nil, []CurvePoint{
			{Tau: -5, Escalated: 0.25, Cost: 0.35, Accuracy: 0.25},
			{Tau: -2, Escalated: 0.5, Cost: 0.6, Accuracy: 0.5},
			{Tau: -0.5, Escalated: 0.75, Cost: 0.85, Accuracy: 0.5},
			{Tau: 0, Escalated: 1, Cost: 1.1, Accuracy: 0.5},
		}},
	}
	for _, tc := range cases {
		got := CascadeCurve(samples, taus, 0.1, tc.rule)
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.name, diff)
		}
	}

	// 0.1 + 0.2 is 0.30000000000000004 in float64; the curve reports 0.3.
	five := []Sample{
		{SmallLogprobs: []float64{-9}, LargeCorrect: 1},
		{SmallLogprobs: []float64{-0.1}, SmallCorrect: 1},
		{SmallLogprobs: []float64{-0.1}, SmallCorrect: 1},
		{SmallLogprobs: []float64{-0.1}, SmallCorrect: 1},
		{SmallLogprobs: []float64{-0.1}},
	}
	if 0.1+float64(1)/5 == 0.3 {
		t.Fatal("float64 noise assumption does not hold")
	}
	got := CascadeCurve(five, []float64{-1}, 0.1, nil)
	if want := []CurvePoint{{Tau: -1, Escalated: 0.2, Cost: 0.3, Accuracy: 0.8}}; !cmp.Equal(want, got) {
		t.Errorf("got %+v, want %+v", got, want)
	}

	// Another small cost shifts only the cost.
	got = CascadeCurve(samples, []float64{-2}, 0.25, nil)
	if want := []CurvePoint{{Tau: -2, Escalated: 0.5, Cost: 0.75, Accuracy: 0.5}}; !cmp.Equal(want, got) {
		t.Errorf("small cost 0.25: got %+v, want %+v", got, want)
	}

	// No samples: nothing escalated, no accuracy, the small call's cost.
	got = CascadeCurve(nil, []float64{-1, 0}, 0.1, nil)
	if want := []CurvePoint{{Tau: -1, Cost: 0.1}, {Tau: 0, Cost: 0.1}}; !cmp.Equal(want, got) {
		t.Errorf("no samples: got %+v, want %+v", got, want)
	}
	if got := CascadeCurve(samples, nil, 0.1, nil); len(got) != 0 {
		t.Errorf("no taus: got %+v, want no points", got)
	}
}

func TestRoundOutput(t *testing.T) {
	cases := []struct{ in, want float64 }{
		{0.1 + 0.2, 0.3},
		{0.1 + 0.055, 0.155},
		{1.0000000004, 1},
		{1.0000000006, 1.000000001},
		{-0.0000000001, 0},
		{0.935, 0.935},
		{1e7 + 0.1, 1e7 + 0.1}, // beyond the range where rounding applies
	}
	for _, tc := range cases {
		if got := RoundOutput(tc.in); got != tc.want {
			t.Errorf("RoundOutput(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if got := RoundOutput(-0.0000000001); math.Signbit(got) {
		t.Errorf("RoundOutput of a tiny negative is -0; want +0")
	}
	if !math.IsNaN(RoundOutput(math.NaN())) || !math.IsInf(RoundOutput(math.Inf(-1)), -1) {
		t.Error("NaN and infinities must pass through")
	}
}

func TestParseAcceptTemplate(t *testing.T) {
	good := map[string]Accept{
		"mean_logprob > tau":      {MeanLogprob, Greater, 0},
		"min_logprob >= tau":      {MinLogprob, GreaterEq, 0},
		"  mean_logprob>=tau\t":   {MeanLogprob, GreaterEq, 0},
		"min_logprob>tau":         {MinLogprob, Greater, 0},
		"mean_logprob >= tau    ": {MeanLogprob, GreaterEq, 0},
	}
	for tmpl, want := range good {
		rule, err := ParseAcceptTemplate(tmpl)
		if err != nil {
			t.Errorf("ParseAcceptTemplate(%q): %v", tmpl, err)
			continue
		}
		for _, tau := range []float64{-3, -2.75, -0.1, 0, 1e-300, -1.2345678901234567, 7} {
			want.Threshold = tau
			if got := rule(tau); got != want {
				t.Errorf("%q at %v = %+v, want %+v", tmpl, tau, got, want)
			}
			// Literal substitution parses to the same rule.
			viaText, err := ParseAcceptIf(SubstituteTau(tmpl, tau))
			if err != nil || viaText != rule(tau) {
				t.Errorf("%q at %v: substituted text %q parses to %+v, %v; want %+v",
					tmpl, tau, SubstituteTau(tmpl, tau), viaText, err, rule(tau))
			}
		}
	}

	bad := []struct{ tmpl, want string }{
		{"", "exactly once"},
		{"mean_logprob > -1.2", "found it 0 times"},
		{"mean_logprob > taus", "found it 0 times"},
		{"mean_logprob > tau_0", "found it 0 times"},
		{"mean_logprob > tau tau", "found it 2 times"},
		{"mean_logprob < tau", "want > or >="},
		{"max_logprob > tau", `unknown metric "max_logprob"`},
		{"mean_logprob > -tau", "tau must be the whole threshold"},
		{"mean_logprob > 2*tau", "want a finite number"},
		{"tau > -1", `unknown metric "1"`},
	}
	for _, tc := range bad {
		_, err := ParseAcceptTemplate(tc.tmpl)
		if err == nil {
			t.Errorf("ParseAcceptTemplate(%q) succeeded; want an error", tc.tmpl)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, tc.want) || !strings.Contains(msg, "accept_if template \""+tc.tmpl+"\"") {
			t.Errorf("ParseAcceptTemplate(%q) error %q; want it to name the template and contain %q", tc.tmpl, msg, tc.want)
		}
	}

	if got := SubstituteTau("mean_logprob > tau", -0.75); got != "mean_logprob > -0.75" {
		t.Errorf("SubstituteTau = %q", got)
	}
}

func TestReadFixtureDefaultsAndShapes(t *testing.T) {
	in := `{"small_cost": 0.2, "taus": [-1, 0],
	  "samples": [
	    {"small_logprobs": [-0.5, -0.25], "small_correct": true, "large_correct": 1.0},
	    {"small_logprobs": [], "small_correct": false, "large_correct": 0, "id": "empty"}
	  ]}`
	f, err := ReadFixture(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := &Fixture{
		SmallCost: 0.2,
		AcceptIf:  DefaultAcceptTemplate,
		Taus:      []float64{-1, 0},
		Samples: []Sample{
			{SmallLogprobs: []float64{-0.5, -0.25}, SmallCorrect: 1, LargeCorrect: 1},
			{SmallLogprobs: []float64{}, SmallCorrect: 0, LargeCorrect: 0, ID: "empty"},
		},
	}
	if diff := cmp.Diff(want, f); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestReadFixtureErrors(t *testing.T) {
	const goodSample = `{"small_logprobs": [-1], "small_correct": 1, "large_correct": 0, "id": "a"}`
	fixture := func(samples string) string {
		return `{"small_cost": 0.1, "accept_if": "mean_logprob > tau", "taus": [-1, 0], "samples": [` + samples + `]}`
	}
	cases := []struct {
		name, in, want string
	}{
		{"empty input", "", "empty input"},
		{"not JSON", `x`, "line 1, column 1: invalid character 'x'"},
		{"not an object", `[1, 2]`, `want a JSON object, got "["`},
		{"truncated", `{"small_cost": 0.1, "taus": [`, "unexpected end of input"},
		{"syntax error", "{\"small_cost\": 0.1,\n \"taus\": [-1,, 0]}", "line 2, column 14"},
		{"trailing data", fixture(goodSample) + ` {}`, "unexpected data after the fixture object"},
		{"unknown field", `{"small_cost": 0.1, "tau": [0]}`, `unknown field "tau"`},
		{"repeated field", `{"small_cost": 0.1, "small_cost": 0.2}`, `field "small_cost" given twice`},
		{"missing samples", `{"small_cost": 0.1, "taus": [0]}`, `missing field "samples"`},
		{"missing taus", `{"small_cost": 0.1, "samples": [` + goodSample + `]}`, `missing field "taus"`},
		{"missing small_cost", `{"taus": [0], "samples": [` + goodSample + `]}`, `missing field "small_cost"`},
		{"empty taus", `{"small_cost": 0.1, "taus": [], "samples": [` + goodSample + `]}`, "taus: empty"},
		{"null taus", `{"small_cost": 0.1, "taus": null}`, "taus: want an array, got null"},
		{"string tau", `{"small_cost": 0.1, "taus": [0, "NaN"]}`, `taus[1]: want a number, got "NaN"`},
		{"empty samples", fixture(""), "samples: empty"},
		{"samples not an array", `{"small_cost": 0.1, "samples": {}}`, `samples: want an array, got "{"`},
		{"negative small_cost", `{"small_cost": -0.1}`, "small_cost: want >= 0"},
		{"string small_cost", `{"small_cost": "0.1"}`, `small_cost: want a number, got "0.1"`},
		{"huge small_cost", `{"small_cost": 1e400}`, "small_cost: want a finite number, got 1e400"},
		{"bad accept_if", `{"small_cost": 0.1, "accept_if": "mean_logprob < tau"}`, `accept_if template "mean_logprob < tau"`},
		{"accept_if without tau", `{"small_cost": 0.1, "accept_if": "mean_logprob > -1"}`, "tau exactly once"},
		{"null accept_if", `{"small_cost": 0.1, "accept_if": null}`, "accept_if: is null"},
		{"sample not an object", fixture(goodSample + `, 3`), "sample 1: want an object, got 3"},
		{"sample without logprobs", fixture(goodSample + `, {"small_correct": 1, "large_correct": 1, "id": "b"}`),
			`sample 1 (id "b"): missing field "small_logprobs"`},
		{"null logprobs", fixture(`{"small_logprobs": null, "small_correct": 1, "large_correct": 1, "id": "b"}`),
			`sample 0 (id "b"): small_logprobs: want an array, got null`},
		{"null logprob entry", fixture(`{"small_logprobs": [-1, null], "small_correct": 1, "large_correct": 1}`),
			"sample 0: small_logprobs[1]: want a number, got null"},
		{"bare NaN", fixture(goodSample + ",\n" + `{"small_logprobs": [-1, NaN], "small_correct": 1, "large_correct": 1}`),
			"sample 1: line 2, column 25: invalid character 'N'"},
		{"string NaN", fixture(`{"small_logprobs": [-1, "NaN"], "small_correct": 1, "large_correct": 1, "id": "n"}`),
			`sample 0 (id "n"): small_logprobs[1]: want a number, got "NaN"`},
		{"overflowing logprob", fixture(`{"small_logprobs": [-1e999], "small_correct": 1, "large_correct": 1, "id": "n"}`),
			`sample 0 (id "n"): small_logprobs[0]: want a finite number, got -1e999`},
		{"small_correct 2", fixture(`{"small_logprobs": [-1], "small_correct": 2, "large_correct": 1, "id": "x"}`),
			`sample 0 (id "x"): small_correct: want 0 or 1, got 2`},
		{"large_correct 0.5", fixture(goodSample + `, {"small_logprobs": [-1], "small_correct": 0, "large_correct": 0.5}`),
			"sample 1: large_correct: want 0 or 1, got 0.5"},
		{"large_correct string", fixture(`{"small_logprobs": [-1], "small_correct": 0, "large_correct": "1"}`),
			`sample 0: large_correct: want 0 or 1, got "1"`},
		{"correct null", fixture(`{"small_logprobs": [-1], "small_correct": null, "large_correct": 1}`),
			"sample 0: small_correct: want 0 or 1, got null"},
		{"missing large_correct", fixture(`{"small_logprobs": [-1], "small_correct": 1, "id": "m"}`),
			`sample 0 (id "m"): missing field "large_correct"`},
		{"unknown sample field", fixture(`{"small_logprobs": [-1], "small_correct": 1, "large_correct": 1, "smallcorrect": 1}`),
			`sample 0: unknown field "smallcorrect"`},
		{"id not a string", fixture(`{"small_logprobs": [-1], "small_correct": 1, "large_correct": 1, "id": 7}`),
			"sample 0: id: want a string, got 7"},
		{"duplicate id", fixture(goodSample + `, ` + goodSample), `sample 1 (id "a"): id repeats that of sample 0`},
		{"expected too short", `{"small_cost": 0.1, "taus": [-1, 0], "samples": [` + goodSample + `],
			"expected": [{"tau": -1, "escalated": 0, "cost": 0.1, "accuracy": 1}]}`, "expected: 1 points for 2 taus"},
		{"expected wrong tau", `{"small_cost": 0.1, "taus": [-1], "samples": [` + goodSample + `],
			"expected": [{"tau": -2, "escalated": 0, "cost": 0.1, "accuracy": 1}]}`, "expected[0]: tau -2, but taus[0] is -1"},
		{"expected missing field", `{"small_cost": 0.1, "taus": [-1], "samples": [` + goodSample + `],
			"expected": [{"tau": -1, "escalated": 0, "cost": 0.1}]}`, `expected: [0]: missing field "accuracy"`},
	}
	for _, tc := range cases {
		f, err := ReadFixture(strings.NewReader(tc.in))
		if err == nil {
			t.Errorf("%s: ReadFixture succeeded with %+v; want an error containing %q", tc.name, f, tc.want)
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "cascade fixture: ") || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: error %q; want it to start with \"cascade fixture: \" and contain %q", tc.name, msg, tc.want)
		}
		if f != nil {
			t.Errorf("%s: ReadFixture returned a fixture alongside its error", tc.name)
		}
	}
}

func FuzzReadFixture(f *testing.F) {
	seed, err := os.ReadFile("testdata/cascade_sweep.json")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(seed))
	for _, s := range []string{
		`{"small_cost": 0.1, "taus": [0], "samples": [{"small_logprobs": [], "small_correct": 1, "large_correct": 0}]}`,
		`{"small_cost": 0.1, "taus": [0], "samples": [{"small_logprobs": [-1, NaN]}]}`,
		`{"small_cost": 0.1, "accept_if": "min_logprob >= tau", "taus": [-1]}`, `{}`, `[]`, ``,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fx, err := ReadFixture(strings.NewReader(s))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "cascade fixture: ") {
				t.Fatalf("error %q lacks the prefix", err)
			}
			return
		}
		if len(fx.Taus) == 0 || len(fx.Samples) == 0 || fx.SmallCost < 0 || math.IsInf(fx.SmallCost, 0) {
			t.Fatalf("accepted a fixture breaking its invariants: %+v", fx)
		}
		rule, err := ParseAcceptTemplate(fx.AcceptIf)
		if err != nil {
			t.Fatalf("accepted accept_if %q: %v", fx.AcceptIf, err)
		}
		for _, s := range fx.Samples {
			if s.SmallCorrect&^1 != 0 || s.LargeCorrect&^1 != 0 {
				t.Fatalf("accepted correctness %d, %d", s.SmallCorrect, s.LargeCorrect)
			}
		}
		for _, p := range CascadeCurve(fx.Samples, fx.Taus, fx.SmallCost, rule) {
			if p.Escalated < 0 || p.Escalated > 1 || p.Accuracy < 0 || p.Accuracy > 1 {
				t.Fatalf("point out of range: %+v", p)
			}
		}
	})
}

// TestFixtureEdges: the edges of the fixture's values and of the accept_if template's tau.
func TestFixtureEdges(t *testing.T) {
	const sample = `{"small_logprobs": [-1], "small_correct": 1, "large_correct": 0}`
	for _, cost := range []string{"0", "9", "0.0", "-0"} {
		f, err := ReadFixture(strings.NewReader(`{"small_cost": ` + cost + `, "taus": [0], "samples": [` + sample + `]}`))
		if err != nil {
			t.Fatalf("small_cost %s: %v", cost, err)
		}
		if want, _ := strconv.ParseFloat(cost, 64); f.SmallCost != want {
			t.Fatalf("small_cost %s read as %v", cost, f.SmallCost)
		}
	}
	// A value is quoted in full up to 40 bytes, cut after 40.
	for _, n := range []int{40, 41} {
		v := `"` + strings.Repeat("x", n-2) + `"`
		_, err := ReadFixture(strings.NewReader(`{"small_cost": ` + v + `}`))
		want := "small_cost: want a number, got " + v
		if n > 40 {
			want = "small_cost: want a number, got " + v[:40] + "…"
		}
		if err == nil || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("%d-byte value: %v, want it to end in %q", n, err, want)
		}
	}
	// tau is a word when the bytes around it cannot continue an identifier.
	for _, c := range []string{"/", ":", "`", "{", "@", "[", "\x7f", " ", "-"} {
		if n := len(tauWords("tau" + c + "1")); n != 1 {
			t.Errorf("%q: %d words", "tau"+c+"1", n)
		}
		if n := len(tauWords("1" + c + "tau")); n != 1 {
			t.Errorf("%q: %d words", "1"+c+"tau", n)
		}
	}
	for _, c := range []string{"0", "9", "a", "z", "A", "Z", "_", ".", "\x80"} {
		if n := len(tauWords("tau" + c)); n != 0 {
			t.Errorf("%q: %d words", "tau"+c, n)
		}
		if n := len(tauWords(c + "tau")); n != 0 {
			t.Errorf("%q: %d words", c+"tau", n)
		}
	}
}
