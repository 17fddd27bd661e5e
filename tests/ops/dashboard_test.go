package ops

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// dashboard is the part of Grafana's JSON model the tests read.
type dashboard struct {
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int         `json:"id"`
	Type       string      `json:"type"`
	Title      string      `json:"title"`
	Datasource *datasource `json:"datasource"`
	GridPos    gridPos     `json:"gridPos"`
	Targets    []target    `json:"targets"`
	Panels     []panel     `json:"panels"` // a collapsed row's panels
}

type gridPos struct{ H, W, X, Y int }

type datasource struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type target struct {
	Expr       string      `json:"expr"`
	RefID      string      `json:"refId"`
	Datasource *datasource `json:"datasource"`
}

type variable struct {
	Name       string      `json:"name"`
	Type       string      `json:"type"`
	Query      any         `json:"query"`
	Datasource *datasource `json:"datasource"`
	AllValue   string      `json:"allValue"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	var d dashboard
	if err := json.Unmarshal(readDeploy(t, "grafana", "tlgw.json"), &d); err != nil {
		t.Fatalf("deploy/grafana/tlgw.json: %v", err)
	}
	return d
}

// queryPanels are the dashboard's panels that are not rows, collapsed rows' panels included.
func (d dashboard) queryPanels() []panel {
	var out []panel
	for _, p := range d.Panels {
		if p.Type == "row" {
			out = append(out, p.Panels...)
			continue
		}
		out = append(out, p)
	}
	return out
}

// query is one PromQL expression of the dashboard and where it is.
type query struct {
	where string // "panel \"Title\" target A" or "variable instance"
	expr  string // as written, with template variables
}

func (d dashboard) queries() []query {
	var out []query
	for _, p := range d.queryPanels() {
		for _, tg := range p.Targets {
			out = append(out, query{fmt.Sprintf("panel %q target %s", p.Title, tg.RefID), tg.Expr})
		}
	}
	return out
}

// variableQuery is a query variable's label_values(…) text.
func (v variable) variableQuery() string {
	switch q := v.Query.(type) {
	case string:
		return q
	case map[string]any:
		s, _ := q["query"].(string)
		return s
	}
	return ""
}

// templateValues are what the tests put for the dashboard's template variables: every variable
// the dashboard defines is a regex matcher whose "All" is .*; Grafana's interval variables get
// durations that fit the test's short run.
var templateValues = map[string]string{
	"__rate_interval": "1m",
	"__interval":      "15s",
	"__range":         "5m",
	"job":             ".*",
	"instance":        ".*",
	"route":           ".*",
}

var templateVar = regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(?::[a-z]+)?\}|\$([A-Za-z0-9_]+)|\[\[([A-Za-z0-9_]+)\]\]`)

// expand substitutes the template variables of expr; an unknown variable is an error.
func expand(expr string) (string, error) {
	var unknown []string
	out := templateVar.ReplaceAllStringFunc(expr, func(m string) string {
		sm := templateVar.FindStringSubmatch(m)
		name := sm[1] + sm[2] + sm[3]
		v, ok := templateValues[name]
		if !ok {
			unknown = append(unknown, name)
			return m
		}
		return v
	})
	if len(unknown) > 0 {
		return "", fmt.Errorf("unknown template variables %v", unknown)
	}
	return out, nil
}

// requiredMetrics are the series SPEC R11/R17.2 and the task ask the dashboard to show.
var requiredMetrics = []string{
	"tlgw_actor_mailbox_length", "tlgw_actor_message_seconds_bucket", "tlgw_requests_total",
	"tlgw_time_to_first_byte_seconds_bucket", "tlgw_routing_decisions_total", "tlgw_workers",
	"tlgw_failovers_total", "tlgw_streams_interrupted_total", "tlgw_queue_length",
	"tlgw_queue_wait_seconds_bucket", "tlgw_queue_rejections_total", "tlgw_outlier_ejections_total",
	"tlgw_scrape_errors_total", "tlgw_programs", "tlgw_config_store_up", "tlgw_cluster_replicas",
	"tlgw_stage_seconds_bucket", "tlgw_route_routable_workers",
}

// TestDashboardModel checks the Grafana JSON model: a Prometheus datasource variable that every
// panel and target uses, job/instance/route variables, unique panel ids, a grid that fits 24
// columns without overlaps, and the series the dashboard must show.
func TestDashboardModel(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: both must be set", d.UID, d.Title)
	}
	if d.SchemaVersion < 36 || d.SchemaVersion > 41 {
		t.Errorf("schemaVersion %d, want about 39 (Grafana 10/11)", d.SchemaVersion)
	}
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if ds, ok := vars["datasource"]; !ok || ds.Type != "datasource" || ds.variableQuery() != "prometheus" {
		t.Errorf("templating: want a variable datasource of type datasource over prometheus, got %+v", ds)
	}
	for _, name := range []string{"job", "instance", "route"} {
		v, ok := vars[name]
		if !ok {
			t.Errorf("templating: no %s variable", name)
			continue
		}
		if v.Type != "query" || v.Datasource == nil || v.Datasource.UID != "${datasource}" ||
			!strings.HasPrefix(v.variableQuery(), "label_values(") || v.AllValue != ".*" {
			t.Errorf("variable %s: want a label_values query on ${datasource} with allValue .*, got %+v", name, v)
		}
	}

	ids := map[int]string{}
	type cell struct{ x, y int }
	taken := map[cell]string{}
	var exprs []string
	for _, p := range d.Panels {
		if p.Type == "row" {
			if p.GridPos.W != 24 || p.GridPos.H != 1 {
				t.Errorf("row %q: gridPos %+v, want full width, height 1", p.Title, p.GridPos)
			}
		}
	}
	all := append([]panel(nil), d.Panels...)
	for _, p := range d.Panels {
		all = append(all, p.Panels...)
	}
	for _, p := range all {
		if prev, dup := ids[p.ID]; dup || p.ID == 0 {
			t.Errorf("panel %q: id %d (also %q)", p.Title, p.ID, prev)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside 24 columns", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := taken[cell{x, y}]; ok {
					t.Errorf("panel %q overlaps %q at (%d,%d)", p.Title, other, x, y)
					break
				}
				taken[cell{x, y}] = p.Title
			}
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q: datasource %+v, want prometheus ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no target", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" || tg.RefID == "" {
				t.Errorf("panel %q: target %+v without expr or refId", p.Title, tg)
			}
			if tg.Datasource == nil || tg.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q target %s: datasource %+v, want ${datasource}", p.Title, tg.RefID, tg.Datasource)
			}
			if _, err := expand(tg.Expr); err != nil {
				t.Errorf("panel %q target %s: %v", p.Title, tg.RefID, err)
			}
			exprs = append(exprs, tg.Expr)
		}
	}
	joined := strings.Join(exprs, "\n")
	for _, m := range requiredMetrics {
		if !slices.Contains(metricNames(joined), m) {
			t.Errorf("no panel shows %s", m)
		}
	}
	if !strings.Contains(joined, `stage=~"parse|queue|pick"`) {
		t.Errorf("no panel shows how much the gateway adds (tlgw_stage_seconds over parse, queue, pick)")
	}
}

// metricRef matches the series names a query reads: the gateway's own, the Go and process
// collectors' and Prometheus's up. A recording rule's name (with colons) is not one.
var metricRef = regexp.MustCompile(`(?:^|[^A-Za-z0-9_:])((?:tlgw|go|process)_[A-Za-z0-9_]+|up)(?:[^A-Za-z0-9_:(]|$)`)

// metricNames are the distinct series names expr reads, sorted.
func metricNames(expr string) []string {
	var out []string
	// Matches may share a delimiter; scan from each match's name end.
	for i := 0; i < len(expr); {
		loc := metricRef.FindStringSubmatchIndex(expr[i:])
		if loc == nil {
			break
		}
		name := expr[i+loc[2] : i+loc[3]]
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
		i += loc[3]
	}
	slices.Sort(out)
	return out
}

var (
	selector = regexp.MustCompile(`([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}`)
	matcher  = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)`)
	grouping = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	labelsOf = regexp.MustCompile(`label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{[^}]*\})?\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)`)
)

// labelUse is a label an expression needs on some series.
type labelUse struct {
	metrics []string // the label must exist on one of these
	label   string
}

// labelUses are the labels expr selects on (a metric's matchers), groups by, or lists
// (label_values), with the series each must exist on.
func labelUses(expr string) []labelUse {
	var out []labelUse
	for _, m := range selector.FindAllStringSubmatch(expr, -1) {
		for _, l := range matcher.FindAllStringSubmatch(m[2], -1) {
			if l[1] != "__name__" {
				out = append(out, labelUse{[]string{m[1]}, l[1]})
			}
		}
	}
	names := metricNames(expr)
	for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, labelUse{names, l})
			}
		}
	}
	for _, m := range labelsOf.FindAllStringSubmatch(expr, -1) {
		out = append(out, labelUse{[]string{m[1]}, m[2]})
	}
	return out
}

func TestMetricNamesAndLabelUses(t *testing.T) {
	expr := `sum by (route, code) (rate(tlgw_requests_total{job=~"$job",route=~"$route"}[1m])) / ` +
		`job:tlgw_x:rate5m + histogram_quantile(0.9, sum by (le) (rate(tlgw_stage_seconds_bucket[1m]))) + up{job="tlgw"}`
	if got, want := metricNames(expr), []string{"tlgw_requests_total", "tlgw_stage_seconds_bucket", "up"}; !slices.Equal(got, want) {
		t.Errorf("metricNames = %v, want %v", got, want)
	}
	var got []string
	for _, u := range labelUses(expr) {
		got = append(got, fmt.Sprintf("%s:%s", strings.Join(u.metrics, "|"), u.label))
	}
	want := []string{
		"tlgw_requests_total:job", "tlgw_requests_total:route", "up:job",
		"tlgw_requests_total|tlgw_stage_seconds_bucket|up:route", "tlgw_requests_total|tlgw_stage_seconds_bucket|up:code",
		"tlgw_requests_total|tlgw_stage_seconds_bucket|up:le",
	}
	if !slices.Equal(got, want) {
		t.Errorf("labelUses = %v\nwant %v", got, want)
	}
	if got := labelUses(`label_values(tlgw_actors{job=~"$job"}, instance)`); len(got) != 2 || got[1].label != "instance" {
		t.Errorf("label_values: %+v", got)
	}
	if e, err := expand(`rate(x{instance=~"$instance",route=~"${route}"}[$__rate_interval])`); err != nil ||
		e != `rate(x{instance=~".*",route=~".*"}[1m])` {
		t.Errorf("expand = %q, %v", e, err)
	}
	if _, err := expand(`x{a="$nope"}`); err == nil {
		t.Error("expand accepted an unknown variable")
	}
}
