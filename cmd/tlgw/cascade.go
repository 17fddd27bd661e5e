package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/tlgw/tlgw/internal/cascade"
)

const cascadeUsage = `usage:
  tlgw cascade sweep --fixture FILE [--small-cost S] [--accept-if 'mean_logprob > tau']
      print the cascade's cost and quality curve over the fixture's thresholds as JSON:
      [{"tau", "escalated", "cost", "accuracy"}, ...], cost = S + escalated
`

// runCascade runs `tlgw cascade SUBCOMMAND`. Exit codes: 0 done, 1 the
// fixture could not be read, 2 bad usage.
func runCascade(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, cascadeUsage)
		return 2
	}
	switch args[0] {
	case "sweep":
		return runCascadeSweep(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, cascadeUsage)
		return 0
	}
	fmt.Fprintf(stderr, "tlgw cascade: unknown subcommand %q\n%s", args[0], cascadeUsage)
	return 2
}

func runCascadeSweep(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cascade sweep", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("fixture", "", "sweep fixture (JSON with small_cost, accept_if, taus, samples); required")
	smallCost := fs.Float64("small-cost", 0, "cost of a small call relative to a large one (default: the fixture's small_cost)")
	acceptIf := fs.String("accept-if", "", "accept_if template with the word tau for the threshold, e.g. 'min_logprob >= tau' (default: the fixture's accept_if)")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "tlgw cascade sweep: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *path == "" {
		fmt.Fprintln(stderr, "tlgw cascade sweep: --fixture FILE is required")
		return 2
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["small-cost"] && (math.IsNaN(*smallCost) || math.IsInf(*smallCost, 0) || *smallCost < 0) {
		fmt.Fprintf(stderr, "tlgw cascade sweep: --small-cost: want a finite number >= 0, got %v\n", *smallCost)
		return 2
	}

	file, err := os.Open(*path)
	if err != nil {
		fmt.Fprintf(stderr, "tlgw cascade sweep: %v\n", err)
		return 1
	}
	fx, err := cascade.ReadFixture(file)
	file.Close()
	if err != nil {
		fmt.Fprintf(stderr, "tlgw cascade sweep: %s: %v\n", *path, err)
		return 1
	}

	cost := fx.SmallCost
	if set["small-cost"] {
		cost = *smallCost
	}
	tmpl := fx.AcceptIf
	if set["accept-if"] {
		tmpl = *acceptIf
	}
	rule, err := cascade.ParseAcceptTemplate(tmpl)
	if err != nil {
		fmt.Fprintf(stderr, "tlgw cascade sweep: --accept-if: %v\n", err)
		return 2
	}

	curve := cascade.CascadeCurve(fx.Samples, fx.Taus, cost, rule)
	out, err := json.MarshalIndent(curve, "", "  ")
	if err != nil {
		fmt.Fprintf(stderr, "tlgw cascade sweep: %v\n", err)
		return 1
	}
	if _, err := stdout.Write(append(out, '\n')); err != nil {
		fmt.Fprintf(stderr, "tlgw cascade sweep: %v\n", err)
		return 1
	}
	return 0
}
