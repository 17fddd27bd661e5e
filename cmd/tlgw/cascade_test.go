package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/internal/cascade"
)

const sweepFixture = "../../internal/cascade/testdata/cascade_sweep.json"

func loadSweepFixture(t *testing.T) *cascade.Fixture {
	t.Helper()
	f, err := os.Open(sweepFixture)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fx, err := cascade.ReadFixture(f)
	if err != nil {
		t.Fatal(err)
	}
	return fx
}

// sweep runs the command line and decodes its output as a curve.
func sweep(t *testing.T, args ...string) []cascade.CurvePoint {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if code := run(append([]string{"cascade", "sweep"}, args...), &stdout, &stderr); code != 0 {
		t.Fatalf("tlgw cascade sweep %v: exit %d, stderr %q", args, code, stderr.String())
	}
	if stderr.Len() != 0 {
		t.Errorf("tlgw cascade sweep %v wrote to stderr: %q", args, stderr.String())
	}
	out := stdout.Bytes()
	// Each point has exactly the four fields.
	var raw []map[string]json.RawMessage
	if err := json.Unmarshal(out, &raw); err != nil {
		t.Fatalf("output is not a JSON array of objects: %v\n%s", err, out)
	}
	for i, p := range raw {
		if len(p) != 4 || p["tau"] == nil || p["escalated"] == nil || p["cost"] == nil || p["accuracy"] == nil {
			t.Errorf("point %d has fields %v; want tau, escalated, cost, accuracy", i, p)
		}
	}
	var curve []cascade.CurvePoint
	if err := json.Unmarshal(out, &curve); err != nil {
		t.Fatalf("output is not a curve: %v", err)
	}
	return curve
}

func TestCascadeSweepCommand(t *testing.T) {
	fx := loadSweepFixture(t)

	// The fixture's own small cost and rule reproduce its expected curve.
	got := sweep(t, "--fixture", sweepFixture)
	if diff := cmp.Diff(fx.Expected, got); diff != "" {
		t.Errorf("sweep differs from the fixture's expected curve (-want +got):\n%s", diff)
	}
	// Spelling out the defaults changes nothing.
	got = sweep(t, "--fixture", sweepFixture, "--small-cost", "0.1", "--accept-if", "mean_logprob > tau")
	if diff := cmp.Diff(fx.Expected, got); diff != "" {
		t.Errorf("explicit defaults (-want +got):\n%s", diff)
	}

	// Another small cost moves only the cost: cost = S + escalated.
	got = sweep(t, "--fixture="+sweepFixture, "--small-cost=0.25")
	want := make([]cascade.CurvePoint, len(fx.Expected))
	for i, p := range fx.Expected {
		p.Cost = cascade.RoundOutput(0.25 + p.Escalated)
		want[i] = p
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("--small-cost 0.25 (-want +got):\n%s", diff)
	}
	got = sweep(t, "--fixture", sweepFixture, "--small-cost", "0")
	for i, p := range got {
		if p.Cost != p.Escalated || p.Escalated != fx.Expected[i].Escalated {
			t.Errorf("--small-cost 0: point %+v; want cost = escalated = %v", p, fx.Expected[i].Escalated)
		}
	}

	// Another rule is the library's curve under that rule.
	rule, err := cascade.ParseAcceptTemplate("min_logprob >= tau")
	if err != nil {
		t.Fatal(err)
	}
	got = sweep(t, "--fixture", sweepFixture, "--accept-if", "min_logprob >= tau")
	if diff := cmp.Diff(cascade.CascadeCurve(fx.Samples, fx.Taus, fx.SmallCost, rule), got); diff != "" {
		t.Errorf("--accept-if 'min_logprob >= tau' (-want +got):\n%s", diff)
	}
	// The min is below the mean, so the min rule escalates at least as
	// much as the mean rule at every threshold.
	for i, p := range got {
		if p.Escalated < fx.Expected[i].Escalated {
			t.Errorf("tau %v: min_logprob >= tau escalates %v, below mean_logprob > tau's %v",
				p.Tau, p.Escalated, fx.Expected[i].Escalated)
		}
	}
}

func TestCascadeSweepCommandErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	malformed := write("malformed.json", `{"small_cost": 0.1, "taus": [0], "samples": [`)
	noLogprobs := write("nologprobs.json",
		`{"small_cost": 0.1, "taus": [0], "samples": [{"id": "q7", "small_correct": 1, "large_correct": 1}]}`)
	missing := filepath.Join(dir, "absent.json")

	cases := []struct {
		name     string
		args     []string
		code     int
		inStderr []string
	}{
		{"no subcommand", []string{"cascade"}, 2, []string{"usage", "cascade sweep"}},
		{"unknown subcommand", []string{"cascade", "sweeep"}, 2, []string{`unknown subcommand "sweeep"`}},
		{"missing --fixture", []string{"cascade", "sweep"}, 2, []string{"--fixture FILE is required"}},
		{"unknown flag", []string{"cascade", "sweep", "--fixture", sweepFixture, "--tau", "1"}, 2, []string{"-tau"}},
		{"stray argument", []string{"cascade", "sweep", "--fixture", sweepFixture, "extra"}, 2, []string{`unexpected argument "extra"`}},
		{"bad --small-cost", []string{"cascade", "sweep", "--fixture", sweepFixture, "--small-cost", "cheap"}, 2, []string{"small-cost"}},
		{"negative --small-cost", []string{"cascade", "sweep", "--fixture", sweepFixture, "--small-cost", "-1"}, 2, []string{"--small-cost: want a finite number >= 0"}},
		{"NaN --small-cost", []string{"cascade", "sweep", "--fixture", sweepFixture, "--small-cost", "NaN"}, 2, []string{"--small-cost: want a finite number >= 0"}},
		{"missing file", []string{"cascade", "sweep", "--fixture", missing}, 1, []string{"absent.json"}},
		{"malformed JSON", []string{"cascade", "sweep", "--fixture", malformed}, 1, []string{"malformed.json", "unexpected end of input"}},
		{"sample without logprobs", []string{"cascade", "sweep", "--fixture", noLogprobs}, 1, []string{`sample 0 (id "q7")`, "small_logprobs"}},
		{"bad --accept-if operator", []string{"cascade", "sweep", "--fixture", sweepFixture, "--accept-if", "mean_logprob < tau"}, 2,
			[]string{`--accept-if: accept_if template "mean_logprob < tau"`, "want > or >="}},
		{"--accept-if without tau", []string{"cascade", "sweep", "--fixture", sweepFixture, "--accept-if", "mean_logprob > -1"}, 2,
			[]string{`accept_if template "mean_logprob > -1"`, "tau exactly once"}},
		{"--accept-if unknown metric", []string{"cascade", "sweep", "--fixture", sweepFixture, "--accept-if", "median_logprob > tau"}, 2,
			[]string{`accept_if template "median_logprob > tau"`, `unknown metric "median_logprob"`}},
		{"unknown command", []string{"cascades"}, 2, []string{`unknown command "cascades"`}},
	}
	for _, tc := range cases {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr)
		if code != tc.code {
			t.Errorf("%s: exit %d, want %d (stderr %q)", tc.name, code, tc.code, stderr.String())
		}
		if stdout.Len() != 0 {
			t.Errorf("%s: wrote to stdout: %q", tc.name, stdout.String())
		}
		for _, frag := range tc.inStderr {
			if !strings.Contains(stderr.String(), frag) {
				t.Errorf("%s: stderr %q does not contain %q", tc.name, stderr.String(), frag)
			}
		}
	}

	// runCascade directly, as main's switch calls it.
	var stdout, stderr bytes.Buffer
	if code := runCascade([]string{"plot"}, &stdout, &stderr); code == 0 || !strings.Contains(stderr.String(), `unknown subcommand "plot"`) {
		t.Errorf("runCascade(plot): exit %d, stderr %q", code, stderr.String())
	}
	stdout.Reset()
	stderr.Reset()
	if code := runCascade([]string{"help"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "cascade sweep --fixture") {
		t.Errorf("runCascade(help): exit %d, stdout %q", code, stdout.String())
	}
}
