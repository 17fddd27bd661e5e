package cascade

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
)

// DefaultAcceptTemplate is the accept_if template a sweep uses when neither
// the fixture nor the caller names one.
const DefaultAcceptTemplate = "mean_logprob > tau"

// Sample is one prompt of an evaluation set: the small model's per-token
// logprobs for its answer, and whether the small and the large model each
// answered correctly (1) or not (0).
type Sample struct {
	SmallLogprobs []float64 `json:"small_logprobs"`
	SmallCorrect  int       `json:"small_correct"`
	LargeCorrect  int       `json:"large_correct"`
	ID            string    `json:"id"`
}

// CurvePoint is the outcome of one threshold of a sweep.
type CurvePoint struct {
	// Tau is the threshold, as given.
	Tau float64 `json:"tau"`
	// Escalated is the fraction of samples the small answer was not kept for.
	Escalated float64 `json:"escalated"`
	// Cost is SmallCost + Escalated: every prompt pays the small call, the
	// escalated ones also the large call (whose cost is the unit).
	Cost float64 `json:"cost"`
	// Accuracy is the mean over samples of SmallCorrect when kept, else
	// LargeCorrect.
	Accuracy float64 `json:"accuracy"`
}

// Fixture is an evaluation set with the thresholds to sweep and, optionally,
// the curve a correct sweep produces.
type Fixture struct {
	// SmallCost is the cost of a small call relative to a large one.
	SmallCost float64 `json:"small_cost"`
	// AcceptIf is an accept_if template with the word tau standing for the
	// threshold, e.g. "mean_logprob > tau". ReadFixture fills in
	// DefaultAcceptTemplate when the fixture has none.
	AcceptIf string `json:"accept_if"`
	// Taus are the thresholds, in the order the curve reports them.
	Taus []float64 `json:"taus"`
	// Samples is the evaluation set.
	Samples []Sample `json:"samples"`
	// Expected is the curve at Taus, one point per threshold in the same
	// order, or nil when the fixture carries none.
	Expected []CurvePoint `json:"expected"`
}

// ReadFixture reads a sweep fixture: a JSON object with the fields
//
//	small_cost  number, required, finite and >= 0
//	accept_if   string, optional (default DefaultAcceptTemplate); must be a
//	            valid template (see ParseAcceptTemplate)
//	taus        non-empty array of finite numbers, required
//	samples     non-empty array of samples, required
//	expected    optional array of {tau, escalated, cost, accuracy}, one per
//	            tau and with the same tau values in the same order
//
// and each sample is an object with
//
//	small_logprobs  array of finite numbers, required ([] is an answer with
//	                no tokens, which is never accepted)
//	small_correct   0 or 1 (false or true are read as 0 and 1), required
//	large_correct   likewise
//	id              string, optional; ids that are present must be unique
//
// Reading is strict: unknown or repeated fields, null where a value is
// required, a value of the wrong type, and anything after the object are
// errors. Errors about a sample name its index and, when it could be read,
// its id; a syntax error gives the line and column. JSON has no NaN or
// infinity, so a NaN written into a fixture is reported as a syntax error
// (a bare NaN) or as a value of the wrong type (the string "NaN").
func ReadFixture(r io.Reader) (*Fixture, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("cascade fixture: %w", err)
	}
	f, err := readFixture(data)
	if err != nil {
		return nil, fmt.Errorf("cascade fixture: %w", err)
	}
	return f, nil
}

func readFixture(data []byte) (*Fixture, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	// wrap turns a decoder error into one with a position in data.
	wrap := func(err error) error { return positioned(data, err) }

	tok, err := dec.Token()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty input; want a JSON object")
		}
		return nil, wrap(err)
	}
	if tok != json.Delim('{') {
		return nil, fmt.Errorf("want a JSON object, got %s", describeToken(tok))
	}

	f := &Fixture{}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, wrap(err)
		}
		key := tok.(string) // inside an object the decoder yields only string keys here
		if seen[key] {
			return nil, fmt.Errorf("field %q given twice", key)
		}
		seen[key] = true
		var raw json.RawMessage
		switch key {
		case "small_cost", "accept_if", "taus", "expected":
			if err := dec.Decode(&raw); err != nil {
				return nil, fmt.Errorf("%s: %w", key, wrap(err))
			}
		}
		switch key {
		case "small_cost":
			v, err := parseNumber(raw)
			if err != nil {
				return nil, fmt.Errorf("small_cost: %w", err)
			}
			if v < 0 {
				return nil, fmt.Errorf("small_cost: want >= 0, got %v", v)
			}
			f.SmallCost = v
		case "accept_if":
			if isNull(raw) {
				return nil, errors.New("accept_if: is null; want a string such as \"mean_logprob > tau\", or leave the field out")
			}
			if err := json.Unmarshal(raw, &f.AcceptIf); err != nil {
				return nil, fmt.Errorf("accept_if: want a string, got %s", abbreviate(raw))
			}
			if _, err := ParseAcceptTemplate(f.AcceptIf); err != nil {
				return nil, err
			}
		case "taus":
			elems, err := parseArray(raw)
			if err != nil {
				return nil, fmt.Errorf("taus: %w", err)
			}
			if len(elems) == 0 {
				return nil, errors.New("taus: empty; want at least one threshold")
			}
			f.Taus = make([]float64, len(elems))
			for i, e := range elems {
				if f.Taus[i], err = parseNumber(e); err != nil {
					return nil, fmt.Errorf("taus[%d]: %w", i, err)
				}
			}
		case "samples":
			samples, err := readSamples(dec, data)
			if err != nil {
				return nil, err
			}
			f.Samples = samples
		case "expected":
			if f.Expected, err = parseCurve(raw); err != nil {
				return nil, fmt.Errorf("expected: %w", err)
			}
		default:
			return nil, fmt.Errorf("unknown field %q; want small_cost, accept_if, taus, samples or expected", key)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, wrap(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, wrap(err)
		}
		return nil, errors.New("unexpected data after the fixture object")
	}

	for _, req := range []string{"small_cost", "taus", "samples"} {
		if !seen[req] {
			return nil, fmt.Errorf("missing field %q", req)
		}
	}
	if !seen["accept_if"] {
		f.AcceptIf = DefaultAcceptTemplate
	}
	if f.Expected != nil {
		if len(f.Expected) != len(f.Taus) {
			return nil, fmt.Errorf("expected: %d points for %d taus; want one per tau", len(f.Expected), len(f.Taus))
		}
		for i, p := range f.Expected {
			if p.Tau != f.Taus[i] {
				return nil, fmt.Errorf("expected[%d]: tau %v, but taus[%d] is %v", i, p.Tau, i, f.Taus[i])
			}
		}
	}
	return f, nil
}

// readSamples reads the samples array element by element, so that an error
// (even a syntax error) names the sample it is in.
func readSamples(dec *json.Decoder, data []byte) ([]Sample, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("samples: %w", positioned(data, err))
	}
	if tok != json.Delim('[') {
		return nil, fmt.Errorf("samples: want an array, got %s", describeToken(tok))
	}
	samples := []Sample{}
	ids := map[string]int{}
	for i := 0; dec.More(); i++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("sample %d: %w", i, positioned(data, err))
		}
		s, err := parseSample(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sampleName(i, raw), err)
		}
		if s.ID != "" {
			if j, dup := ids[s.ID]; dup {
				return nil, fmt.Errorf("%s: id repeats that of sample %d", sampleName(i, raw), j)
			}
			ids[s.ID] = i
		}
		samples = append(samples, s)
	}
	if _, err := dec.Token(); err != nil { // the closing bracket
		return nil, fmt.Errorf("samples: %w", positioned(data, err))
	}
	if len(samples) == 0 {
		return nil, errors.New("samples: empty; want at least one sample")
	}
	return samples, nil
}

// sampleName is "sample 3" or, when the sample's id can be read, `sample 3
// (id "p003")`.
func sampleName(i int, raw json.RawMessage) string {
	var idOnly struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(raw, &idOnly) == nil && idOnly.ID != "" {
		return fmt.Sprintf("sample %d (id %q)", i, idOnly.ID)
	}
	return fmt.Sprintf("sample %d", i)
}

func parseSample(raw json.RawMessage) (Sample, error) {
	var fields map[string]json.RawMessage
	if isNull(raw) || json.Unmarshal(raw, &fields) != nil {
		return Sample{}, fmt.Errorf("want an object, got %s", abbreviate(raw))
	}
	var s Sample
	for _, key := range slices.Sorted(maps.Keys(fields)) {
		switch key {
		case "small_logprobs", "small_correct", "large_correct", "id":
		default:
			return Sample{}, fmt.Errorf("unknown field %q; want small_logprobs, small_correct, large_correct or id", key)
		}
	}
	lps, ok := fields["small_logprobs"]
	if !ok {
		return Sample{}, errors.New("missing field \"small_logprobs\" (use [] for an answer with no tokens)")
	}
	elems, err := parseArray(lps)
	if err != nil {
		return Sample{}, fmt.Errorf("small_logprobs: %w", err)
	}
	s.SmallLogprobs = make([]float64, len(elems))
	for i, e := range elems {
		if s.SmallLogprobs[i], err = parseNumber(e); err != nil {
			return Sample{}, fmt.Errorf("small_logprobs[%d]: %w", i, err)
		}
	}
	for _, c := range []struct {
		key string
		dst *int
	}{{"small_correct", &s.SmallCorrect}, {"large_correct", &s.LargeCorrect}} {
		v, ok := fields[c.key]
		if !ok {
			return Sample{}, fmt.Errorf("missing field %q", c.key)
		}
		if *c.dst, err = parseCorrect(v); err != nil {
			return Sample{}, fmt.Errorf("%s: %w", c.key, err)
		}
	}
	if id, ok := fields["id"]; ok {
		if isNull(id) || json.Unmarshal(id, &s.ID) != nil {
			return Sample{}, fmt.Errorf("id: want a string, got %s", abbreviate(id))
		}
	}
	return s, nil
}

// parseCorrect reads a correctness mark: a number equal to 0 or 1, or false
// or true.
func parseCorrect(raw json.RawMessage) (int, error) {
	switch string(bytes.TrimSpace(raw)) {
	case "true":
		return 1, nil
	case "false":
		return 0, nil
	}
	v, err := parseNumber(raw)
	if err == nil && (v == 0 || v == 1) {
		return int(v), nil
	}
	return 0, fmt.Errorf("want 0 or 1, got %s", abbreviate(raw))
}

func parseCurve(raw json.RawMessage) ([]CurvePoint, error) {
	elems, err := parseArray(raw)
	if err != nil {
		return nil, err
	}
	points := make([]CurvePoint, len(elems))
	for i, e := range elems {
		var fields map[string]json.RawMessage
		if isNull(e) || json.Unmarshal(e, &fields) != nil {
			return nil, fmt.Errorf("[%d]: want an object, got %s", i, abbreviate(e))
		}
		dst := map[string]*float64{
			"tau": &points[i].Tau, "escalated": &points[i].Escalated,
			"cost": &points[i].Cost, "accuracy": &points[i].Accuracy,
		}
		for _, key := range slices.Sorted(maps.Keys(fields)) {
			if dst[key] == nil {
				return nil, fmt.Errorf("[%d]: unknown field %q; want tau, escalated, cost and accuracy", i, key)
			}
		}
		for _, key := range []string{"tau", "escalated", "cost", "accuracy"} {
			v, ok := fields[key]
			if !ok {
				return nil, fmt.Errorf("[%d]: missing field %q", i, key)
			}
			if *dst[key], err = parseNumber(v); err != nil {
				return nil, fmt.Errorf("[%d].%s: %w", i, key, err)
			}
		}
	}
	return points, nil
}

// parseArray splits a JSON array into its elements; null is not an array.
func parseArray(raw json.RawMessage) ([]json.RawMessage, error) {
	var elems []json.RawMessage
	if isNull(raw) || json.Unmarshal(raw, &elems) != nil {
		return nil, fmt.Errorf("want an array, got %s", abbreviate(raw))
	}
	return elems, nil
}

// parseNumber reads a JSON number as a finite float64; null, strings (such
// as "NaN") and numbers beyond float64's range are errors.
func parseNumber(raw json.RawMessage) (float64, error) {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || !(t[0] == '-' || (t[0] >= '0' && t[0] <= '9')) {
		return 0, fmt.Errorf("want a number, got %s", abbreviate(raw))
	}
	v, err := strconv.ParseFloat(string(t), 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || !json.Valid(t) {
		return 0, fmt.Errorf("want a finite number, got %s", abbreviate(raw))
	}
	return v, nil
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// abbreviate quotes at most 40 bytes of a JSON value for an error message.
func abbreviate(raw []byte) string {
	t := bytes.TrimSpace(raw)
	if len(t) > 40 {
		return string(t[:40]) + "…"
	}
	if len(t) == 0 {
		return "nothing"
	}
	return string(t)
}

func describeToken(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		return fmt.Sprintf("%q", string(v))
	case nil:
		return "null"
	case string:
		return strconv.Quote(v)
	}
	return fmt.Sprint(tok)
}

// positioned adds the line and column of a syntax error in data. The
// decoder's own offsets are not taken: the position comes from scanning data
// from its start, whose first syntax error is the one the decoder met, since
// the decoder reads data in order.
func positioned(data []byte, err error) error {
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return errors.New("unexpected end of input")
		}
		return err
	}
	if !errors.As(json.Unmarshal(data, &struct{}{}), &se) {
		return err
	}
	// Offset counts the bytes read up to and including the offending one.
	bad := min(max(int(se.Offset)-1, 0), len(data))
	line := 1 + bytes.Count(data[:bad], []byte("\n"))
	col := bad - bytes.LastIndexByte(data[:bad], '\n')
	return fmt.Errorf("line %d, column %d: %w", line, col, se)
}

// ParseAcceptTemplate parses an accept_if template: an accept_if rule (see
// ParseAcceptIf) whose threshold is the word tau, such as
// "mean_logprob > tau" or "min_logprob >= tau". The word must appear exactly
// once, as a whole word, and stand for the whole threshold (so "-tau" is
// rejected). The returned function gives the rule for one threshold; it
// equals ParseAcceptIf of the template with tau replaced by the threshold
// written with strconv.FormatFloat(tau, 'g', -1, 64), since that spelling
// parses back to the same float64.
func ParseAcceptTemplate(tmpl string) (func(tau float64) Accept, error) {
	fail := func(format string, args ...any) (func(float64) Accept, error) {
		return nil, fmt.Errorf("accept_if template %q: %s", tmpl, fmt.Sprintf(format, args...))
	}
	if n := len(tauWords(tmpl)); n != 1 {
		return fail("want the word tau exactly once (as in \"mean_logprob > tau\"), found it %d times", n)
	}
	var rule Accept
	// Two probes: the template must parse with tau replaced, and the
	// threshold must be exactly the value put in.
	for _, probe := range []float64{1, -2.5} {
		a, err := ParseAcceptIf(SubstituteTau(tmpl, probe))
		if err != nil {
			var se *SyntaxError
			if errors.As(err, &se) {
				return fail("%s (with tau = %v)", se.Reason, probe)
			}
			return fail("%v", err)
		}
		if a.Threshold != probe {
			return fail("tau must be the whole threshold; with tau = %v the threshold is %v", probe, a.Threshold)
		}
		rule = a
	}
	return func(tau float64) Accept {
		a := rule
		a.Threshold = tau
		return a
	}, nil
}

// SubstituteTau returns the template with each whole-word tau replaced by
// the threshold, written in the shortest form that parses back to it.
func SubstituteTau(tmpl string, tau float64) string {
	num := strconv.FormatFloat(tau, 'g', -1, 64)
	var b strings.Builder
	last := 0
	for _, at := range tauWords(tmpl) {
		b.WriteString(tmpl[last:at])
		b.WriteString(num)
		last = at + len("tau")
	}
	b.WriteString(tmpl[last:])
	return b.String()
}

// tauWords returns the offsets of the word tau in s, not counting tau inside
// a longer identifier.
func tauWords(s string) []int {
	var at []int
	for i := 0; ; {
		j := strings.Index(s[i:], "tau")
		if j < 0 {
			return at
		}
		j += i
		end := j + len("tau")
		if (j == 0 || !isIdentByte(s[j-1])) && (end == len(s) || !isIdentByte(s[end])) {
			at = append(at, j)
		}
		i = end
	}
}

func isIdentByte(c byte) bool {
	return c == '_' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

// CascadeCurve sweeps the thresholds over the samples. For each tau, a
// sample keeps the small model's answer when rule(tau) holds on its
// SmallLogprobs (an answer with no tokens is never kept); the point reports
//
//	escalated = (samples not kept) / len(samples)
//	cost      = smallCost + escalated
//	accuracy  = mean over samples of SmallCorrect if kept, else LargeCorrect
//
// A nil rule is DefaultAcceptTemplate, mean_logprob > tau. With no samples,
// escalated and accuracy are 0 (so cost is smallCost).
//
// Escalated, Cost and Accuracy are rounded to 9 decimal places: each is the
// float64 nearest to a decimal with at most 9 digits after the point, the
// same float64 that strconv.ParseFloat gives for that decimal. This removes
// the noise of binary addition (0.1 + 0.055 is not exactly 0.155 in
// float64), so a curve compares with == against decimals written in a
// fixture, as long as those have at most 9 digits after the point. Tau is
// reported as given.
func CascadeCurve(samples []Sample, taus []float64, smallCost float64, rule func(tau float64) Accept) []CurvePoint {
	if rule == nil {
		rule = func(tau float64) Accept { return Accept{Metric: MeanLogprob, Op: Greater, Threshold: tau} }
	}
	points := make([]CurvePoint, len(taus))
	n := float64(len(samples))
	for i, tau := range taus {
		a := rule(tau)
		escalated, correct := 0, 0
		for _, s := range samples {
			if a.Holds(s.SmallLogprobs) {
				correct += s.SmallCorrect
			} else {
				escalated++
				correct += s.LargeCorrect
			}
		}
		p := CurvePoint{Tau: tau}
		if n > 0 {
			p.Escalated = RoundOutput(float64(escalated) / n)
			p.Accuracy = RoundOutput(float64(correct) / n)
		}
		p.Cost = RoundOutput(smallCost + p.Escalated)
		points[i] = p
	}
	return points
}

// roundScale is 10^9: outputs are rounded to 9 decimal places.
const roundScale = 1e9

// RoundOutput rounds x to 9 decimal places (half away from zero), the
// rounding CascadeCurve applies to its outputs. Values whose magnitude is at
// least 2^52 / 10^9 (about 4.5e6) have no noise left at that scale and are
// returned as they are, as are NaN and infinities. Negative zero becomes
// zero.
func RoundOutput(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) || math.Abs(x) >= (1<<52)/roundScale {
		return x
	}
	// math.Round gives an integer k with |k| < 2^52, exact in float64; k /
	// 10^9 is then the correctly rounded quotient, the float64 nearest to
	// the decimal k·10^-9. Adding 0 turns -0 into +0.
	return math.Round(x*roundScale)/roundScale + 0
}
