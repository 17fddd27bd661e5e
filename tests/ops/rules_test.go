package ops

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestPromtoolCheckRules: promtool accepts deploy/prometheus/rules.yml.
func TestPromtoolCheckRules(t *testing.T) {
	promtool := tool(t, "promtool")
	readDeploy(t, "prometheus", "rules.yml")
	out, err := run(t, repoRoot, promtool, "check", "rules", "deploy/prometheus/rules.yml")
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(out))
}

// TestPromtoolCheckConfig: promtool accepts the example scrape configuration, and its rule_files
// entry (relative to the config's directory) finds rules.yml, from the repository root and from
// deploy/prometheus alike.
func TestPromtoolCheckConfig(t *testing.T) {
	promtool := tool(t, "promtool")
	readDeploy(t, "prometheus", "prometheus.yml")
	for _, c := range []struct{ dir, path string }{
		{repoRoot, "deploy/prometheus/prometheus.yml"},
		{deployPath("prometheus"), "prometheus.yml"},
	} {
		out, err := run(t, c.dir, promtool, "check", "config", c.path)
		if err != nil {
			t.Fatalf("promtool check config %s (in %s): %v\n%s", c.path, c.dir, err, out)
		}
		if !strings.Contains(out, "1 rule files found") || !strings.Contains(out, "rules.yml") {
			t.Fatalf("promtool check config %s (in %s) did not load rules.yml:\n%s", c.path, c.dir, out)
		}
	}
}

// TestPromtoolTestRules runs the rules' unit tests (deploy/prometheus/rules_test.yml).
func TestPromtoolTestRules(t *testing.T) {
	promtool := tool(t, "promtool")
	readDeploy(t, "prometheus", "rules.yml")
	readDeploy(t, "prometheus", "rules_test.yml")
	out, err := run(t, repoRoot, promtool, "test", "rules", "deploy/prometheus/rules_test.yml")
	if err != nil || !strings.Contains(out, "SUCCESS") {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}

var (
	alertLine     = regexp.MustCompile(`(?m)^\s*- alert:\s*(\S+)\s*$`)
	alertnameLine = regexp.MustCompile(`^\s*alertname:\s*(\S+)\s*$`)
	expAlertsLine = regexp.MustCompile(`^\s*exp_alerts:\s*(.*)$`)
)

// TestRulesUnitTestsCoverEveryAlert: rules_test.yml checks every alert of rules.yml at least
// once firing (a non-empty exp_alerts) and at least once quiet (exp_alerts: []).
func TestRulesUnitTestsCoverEveryAlert(t *testing.T) {
	var alerts []string
	for _, m := range alertLine.FindAllStringSubmatch(string(readDeploy(t, "prometheus", "rules.yml")), -1) {
		alerts = append(alerts, m[1])
	}
	if len(alerts) == 0 {
		t.Fatal("rules.yml has no alert")
	}
	firing, quiet := map[string]bool{}, map[string]bool{}
	name := ""
	for _, line := range strings.Split(string(readDeploy(t, "prometheus", "rules_test.yml")), "\n") {
		if m := alertnameLine.FindStringSubmatch(line); m != nil {
			name = m[1]
		} else if m := expAlertsLine.FindStringSubmatch(line); m != nil && name != "" {
			if strings.TrimSpace(m[1]) == "[]" {
				quiet[name] = true
			} else {
				firing[name] = true
			}
			name = ""
		}
	}
	for _, a := range alerts {
		if !firing[a] {
			t.Errorf("rules_test.yml never expects %s to fire", a)
		}
		if !quiet[a] {
			t.Errorf("rules_test.yml never expects %s to stay quiet (exp_alerts: [])", a)
		}
	}
	for a := range firing {
		if !slices.Contains(alerts, a) {
			t.Errorf("rules_test.yml tests %s, which rules.yml does not define", a)
		}
	}
	// The alerts SPEC R17.2 asks for.
	for _, want := range []string{"TLGWRouteNoRoutableWorker", "TLGWStreamsInterrupted", "TLGWQueueTimeouts",
		"TLGWStaticWorkerScrapeErrors", "TLGWOutlierEjections", "TLGWConfigStoreDown"} {
		if !slices.Contains(alerts, want) {
			t.Errorf("rules.yml has no alert %s", want)
		}
	}
}
