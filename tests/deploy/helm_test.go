// Package deploy checks what tlgw ships for Kubernetes (R23): the helm chart lints and renders,
// every rendered object decodes strictly into its Kubernetes type, the security properties,
// probes and replica counts hold, the rendered tlgw.toml passes the gateway's own config loader,
// the committed examples under deploy/kubernetes are the chart's current output, and the
// Dockerfile builds a static, non-root image.
package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"

	"github.com/tlgw/tlgw/internal/config"
)

const (
	chartDir    = "../../deploy/helm/tlgw"
	examplesDir = "../../deploy/kubernetes"
	// kubeVersion is the cluster version templates render for: the chart needs ≥ 1.30 (the
	// preStop sleep action).
	kubeVersion = "1.34.0"
	// helmInstall is how .ci/run installs helm; the tests say it when helm is missing.
	helmInstall = "go install helm.sh/helm/v3/cmd/helm@v3.21.4"
)

// helmBin finds helm on PATH, else in $(go env GOPATH)/bin where .ci/run installs it; a
// missing helm fails the test (it never skips).
func helmBin(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		for _, dir := range filepath.SplitList(strings.TrimSpace(string(out))) {
			p := filepath.Join(dir, "bin", "helm")
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				return p
			}
		}
	}
	t.Fatalf("helm is not on PATH nor in $(go env GOPATH)/bin: run .ci/run, or %s", helmInstall)
	return ""
}

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out), nil
}

// render runs helm template for the release "tlgw" in namespace ns with the values files
// and --set pairs given.
func render(t *testing.T, ns string, valuesFiles []string, sets ...string) (string, error) {
	t.Helper()
	args := []string{"template", "tlgw", chartDir, "--namespace", ns, "--kube-version", kubeVersion}
	for _, f := range valuesFiles {
		args = append(args, "-f", f)
	}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	return helm(t, args...)
}

func TestHelmVersion(t *testing.T) {
	out, err := helm(t, "version", "--short")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(strings.TrimSpace(out), "v3.") {
		t.Fatalf("helm version %q: the chart is apiVersion v2 for helm 3 (%s)", out, helmInstall)
	}
	t.Logf("helm %s", strings.TrimSpace(out))
}

func TestHelmLint(t *testing.T) {
	for _, values := range append([]string{""}, exampleValues(t)...) {
		args := []string{"lint", "--strict", chartDir, "--kube-version", kubeVersion}
		if values != "" {
			args = append(args, "-f", values)
		}
		if out, err := helm(t, args...); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
}

// exampleValues are the values files of the committed examples, each rendered next to it.
func exampleValues(t *testing.T) []string {
	t.Helper()
	vs, err := filepath.Glob(filepath.Join(examplesDir, "*.values.yaml"))
	if err != nil || len(vs) < 2 {
		t.Fatalf("examples under %s: %v %v", examplesDir, vs, err)
	}
	return vs
}

// exampleNamespace is the namespace the examples are rendered for.
const exampleNamespace = "llm"

// TestExamplesAreCurrent: each deploy/kubernetes/X.yaml is what the chart renders from
// X.values.yaml today, and passes every check below.
func TestExamplesAreCurrent(t *testing.T) {
	for _, vf := range exampleValues(t) {
		t.Run(filepath.Base(vf), func(t *testing.T) {
			got, err := render(t, exampleNamespace, []string{vf})
			if err != nil {
				t.Fatal(err)
			}
			golden := strings.TrimSuffix(vf, ".values.yaml") + ".yaml"
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Fatalf("%s is stale: re-render it with\n  helm template tlgw deploy/helm/tlgw --namespace %s --kube-version %s -f %s > %s",
					golden, exampleNamespace, kubeVersion, strings.TrimPrefix(vf, "../../"), strings.TrimPrefix(golden, "../../"))
			}
			cfg := checkRelease(t, got, loadValues(t, vf))
			// The single replica follows its vLLM pods through the headless Service's records.
			if strings.HasPrefix(filepath.Base(vf), "single-vllm") &&
				(len(cfg.Gateway.EnginePools) != 1 || cfg.Gateway.EnginePools[0].DNS != "vllm-headless."+exampleNamespace+".svc.cluster.local:8000") {
				t.Fatalf("engine pools %+v: one over vllm-headless", cfg.Gateway.EnginePools)
			}
		})
	}
}

// TestChartRenders: the default values and variations of them render objects that pass
// every check.
func TestChartRenders(t *testing.T) {
	cases := []struct {
		name string
		sets []string
	}{
		{"defaults", nil},
		{"five replicas, external etcd, ServiceMonitor", []string{"replicaCount=5", "etcd.externalEndpoints={etcd-a.db.svc:2379,etcd-b.db.svc:2379}",
			"serviceMonitor.enabled=true", "shutdownGraceSeconds=120", "preStopSleepSeconds=0"}},
		{"one etcd member, no PDB", []string{"replicaCount=2", "etcd.enabled=true", "etcd.replicas=1", "podDisruptionBudget.enabled=false"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := render(t, "gw", nil, c.sets...)
			if err != nil {
				t.Fatal(err)
			}
			vals := loadValues(t, filepath.Join(chartDir, "values.yaml"))
			for _, s := range c.sets {
				k, v, _ := strings.Cut(s, "=")
				setValue(t, vals, k, v)
			}
			checkRelease(t, out, vals)
		})
	}
}

// TestChartRefuses: values the gateway would refuse at start-up fail at render time, naming
// the value.
func TestChartRefuses(t *testing.T) {
	cases := []struct {
		sets []string
		want string
	}{
		{[]string{"replicaCount=3"}, "replicaCount > 1 needs a shared control plane"},
		{[]string{"config.gateway=http_listen = \"0.0.0.0:1\""}, "config.gateway must not set http_listen"},
		{[]string{"config.tables=[cluster]"}, "config.tables must not hold"},
		{[]string{"config.tables=[registry]"}, "config.tables must not hold [registry]"},
		{[]string{"etcd.enabled=true", "etcd.externalEndpoints={a:2379}"}, "mutually exclusive"},
		{[]string{"shutdownGraceSeconds=0"}, "shutdownGraceSeconds must be at least 1"},
	}
	for _, c := range cases {
		out, err := render(t, "gw", nil, c.sets...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%v: want a failure saying %q, got %v\n%s", c.sets, c.want, err, out)
		}
	}
}

// values is a chart's values as helm reads them (numbers as float64).
type values map[string]any

func loadValues(t *testing.T, file string) values {
	t.Helper()
	base, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v values
	if err := yaml.Unmarshal(base, &v); err != nil {
		t.Fatal(err)
	}
	if filepath.Base(file) != "values.yaml" {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var over values
		if err := yaml.Unmarshal(b, &over); err != nil {
			t.Fatal(err)
		}
		merge(v, over)
	}
	return v
}

// merge overlays over onto base as helm does: maps merge key by key, anything else replaces.
func merge(base, over map[string]any) {
	for k, ov := range over {
		if om, ok := ov.(map[string]any); ok {
			if bm, ok := base[k].(map[string]any); ok {
				merge(bm, om)
				continue
			}
		}
		base[k] = ov
	}
}

// setValue applies one --set a.b=v the tests use: numbers, booleans, {x,y} lists, strings.
func setValue(t *testing.T, v values, key, val string) {
	t.Helper()
	parts := strings.Split(key, ".")
	m := map[string]any(v)
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			t.Fatalf("--set %s: %s is not a map", key, p)
		}
		m = next
	}
	var x any = val
	if f, err := strconv.ParseFloat(val, 64); err == nil {
		x = f
	} else if b, err := strconv.ParseBool(val); err == nil {
		x = b
	} else if strings.HasPrefix(val, "{") && strings.HasSuffix(val, "}") {
		var l []any
		for _, e := range strings.Split(strings.Trim(val, "{}"), ",") {
			l = append(l, e)
		}
		x = l
	}
	m[parts[len(parts)-1]] = x
}

func (v values) get(t *testing.T, key string) any {
	t.Helper()
	var cur any = map[string]any(v)
	for _, p := range strings.Split(key, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			t.Fatalf("value %s: %s is not a map", key, p)
		}
		cur = m[p]
	}
	return cur
}

func (v values) int(t *testing.T, key string) int {
	t.Helper()
	f, ok := v.get(t, key).(float64)
	if !ok {
		t.Fatalf("value %s = %v is not a number", key, v.get(t, key))
	}
	return int(f)
}

func (v values) bool(t *testing.T, key string) bool {
	t.Helper()
	b, _ := v.get(t, key).(bool)
	return b
}

// release is one rendering, each object decoded strictly into its type.
type release struct {
	deployments    []*appsv1.Deployment
	statefulSets   []*appsv1.StatefulSet
	services       []*corev1.Service
	configMaps     []*corev1.ConfigMap
	pdbs           []*policyv1.PodDisruptionBudget
	serviceMonitor []map[string]any
}

// decodeRelease splits helm's output into documents and decodes each strictly: an unknown
// field, a duplicate key or an unknown kind fails.
func decodeRelease(t *testing.T, out string) *release {
	t.Helper()
	r := &release{}
	for i, doc := range strings.Split(out, "\n---\n") {
		if strings.TrimSpace(stripComments(doc)) == "" || strings.TrimSpace(doc) == "---" {
			continue
		}
		var tm struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("document %d: %v\n%s", i, err, doc)
		}
		strict := func(into any) {
			if err := yaml.UnmarshalStrict([]byte(doc), into); err != nil {
				t.Fatalf("document %d (%s %s) does not decode strictly: %v\n%s", i, tm.APIVersion, tm.Kind, err, doc)
			}
		}
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 Deployment":
			o := &appsv1.Deployment{}
			strict(o)
			r.deployments = append(r.deployments, o)
		case "apps/v1 StatefulSet":
			o := &appsv1.StatefulSet{}
			strict(o)
			r.statefulSets = append(r.statefulSets, o)
		case "v1 Service":
			o := &corev1.Service{}
			strict(o)
			r.services = append(r.services, o)
		case "v1 ConfigMap":
			o := &corev1.ConfigMap{}
			strict(o)
			r.configMaps = append(r.configMaps, o)
		case "policy/v1 PodDisruptionBudget":
			o := &policyv1.PodDisruptionBudget{}
			strict(o)
			r.pdbs = append(r.pdbs, o)
		case "monitoring.coreos.com/v1 ServiceMonitor":
			// k8s.io/api has no type for it: unstructured, its required fields checked below.
			var o map[string]any
			strict(&o)
			r.serviceMonitor = append(r.serviceMonitor, o)
		default:
			t.Fatalf("document %d: unexpected %s %s", i, tm.APIVersion, tm.Kind)
		}
	}
	return r
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// checkRelease is every property of a rendering of the chart with values v.
func checkRelease(t *testing.T, out string, v values) *config.Config {
	t.Helper()
	r := decodeRelease(t, out)
	if len(r.deployments) != 1 || len(r.configMaps) != 1 {
		t.Fatalf("want one Deployment and one ConfigMap, got %d and %d", len(r.deployments), len(r.configMaps))
	}
	d, cm := r.deployments[0], r.configMaps[0]
	pod := d.Spec.Template

	// Replicas, and the selector picks the pods.
	if d.Spec.Replicas == nil || int(*d.Spec.Replicas) != v.int(t, "replicaCount") {
		t.Fatalf("replicas %v, values say %d", d.Spec.Replicas, v.int(t, "replicaCount"))
	}
	if !selects(d.Spec.Selector.MatchLabels, pod.Labels) {
		t.Fatalf("the Deployment's selector %v does not select its pods %v", d.Spec.Selector.MatchLabels, pod.Labels)
	}

	// The config: parsed and validated by the gateway's own loader, with the environment
	// the pod gets (a key_env, token_env or password_env must come from the pod's env).
	toml, ok := cm.Data["tlgw.toml"]
	if !ok {
		t.Fatalf("ConfigMap %s has no tlgw.toml", cm.Name)
	}
	if len(pod.Spec.Containers) != 1 {
		t.Fatalf("%d containers", len(pod.Spec.Containers))
	}
	c := pod.Spec.Containers[0]
	env := map[string]bool{}
	for _, e := range c.Env {
		if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil || e.ValueFrom.SecretKeyRef.Name == "" || e.ValueFrom.SecretKeyRef.Key == "" {
			t.Fatalf("env %s is not a Secret reference", e.Name)
		}
		env[e.Name] = true
	}
	var asked []string
	cfg, err := config.Parse([]byte(toml), func(name string) string {
		asked = append(asked, name)
		if env[name] {
			return "secret-of-" + name
		}
		return ""
	})
	if err != nil {
		t.Fatalf("the rendered tlgw.toml does not pass tlgw's config loader: %v\n%s", err, toml)
	}
	for name := range env {
		if !slices.Contains(asked, name) {
			t.Fatalf("env %s is set from a Secret but the config reads no such variable (asked: %v)", name, asked)
		}
	}
	if len(cfg.Auth.Keys) != len(asSlice(v.get(t, "apiKeys"))) {
		t.Fatalf("%d API keys in the config, %d in values", len(cfg.Auth.Keys), len(asSlice(v.get(t, "apiKeys"))))
	}

	// Listeners: every interface, on the container's named ports.
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for name, listen := range map[string]string{"http": cfg.Gateway.HTTPListen, "registry": cfg.Gateway.RegistryListen} {
		host, port, err := net.SplitHostPort(listen)
		if err != nil || host != "0.0.0.0" || port != strconv.Itoa(int(ports[name])) || ports[name] != int32(v.int(t, "ports."+name)) {
			t.Fatalf("%s listens on %q; the container port %s is %d, values say %d", name, listen, name, ports[name], v.int(t, "ports."+name))
		}
	}

	// The image's entrypoint reads /etc/tlgw/tlgw.toml: the ConfigMap is mounted there,
	// read-only, and the args say so too.
	if !slices.Equal(c.Args, []string{"serve", "--config", "/etc/tlgw/tlgw.toml"}) {
		t.Fatalf("args %v", c.Args)
	}
	mounted := false
	for _, m := range c.VolumeMounts {
		if m.MountPath != "/etc/tlgw" {
			t.Fatalf("a volume mounted at %s: the gateway writes nowhere and reads only /etc/tlgw", m.MountPath)
		}
		for _, vol := range pod.Spec.Volumes {
			if vol.Name == m.Name && vol.ConfigMap != nil && vol.ConfigMap.Name == cm.Name && m.ReadOnly {
				mounted = true
			}
		}
	}
	if !mounted {
		t.Fatalf("ConfigMap %s is not mounted read-only at /etc/tlgw", cm.Name)
	}
	if strings.HasSuffix(c.Image, ":latest") || !strings.Contains(c.Image, ":") {
		t.Fatalf("image %q: a pinned tag", c.Image)
	}

	// Security.
	checkPodSecurity(t, pod.Spec, "gateway")
	if pod.Spec.AutomountServiceAccountToken == nil || *pod.Spec.AutomountServiceAccountToken {
		t.Fatal("the gateway needs no Kubernetes API token: automountServiceAccountToken must be false")
	}

	// Resources from values.
	for _, kind := range []string{"requests", "limits"} {
		list := c.Resources.Requests
		if kind == "limits" {
			list = c.Resources.Limits
		}
		for _, res := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			want := fmt.Sprint(v.get(t, "resources."+kind+"."+string(res)))
			got := list[res]
			if got.String() != want {
				t.Fatalf("resources.%s.%s = %s, values say %s", kind, res, got.String(), want)
			}
		}
	}

	// Probes.
	probe := func(p *corev1.Probe, what, path string) {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || p.HTTPGet.Port.String() != "http" {
			t.Fatalf("%s probe %+v: want GET %s on port http", what, p, path)
		}
	}
	probe(c.LivenessProbe, "liveness", "/healthz")
	probe(c.ReadinessProbe, "readiness", "/readyz")

	// Termination: the kubelet's SIGKILL comes after the preStop sleep and a whole drain.
	grace := cfg.Gateway.ShutdownGrace
	if int(grace.Seconds()) != v.int(t, "shutdownGraceSeconds") {
		t.Fatalf("shutdown_grace %v, values say %ds", grace, v.int(t, "shutdownGraceSeconds"))
	}
	sleep := 0
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		if c.Lifecycle.PreStop.Sleep == nil {
			t.Fatalf("preStop %+v: only a sleep (the image has no shell)", c.Lifecycle.PreStop)
		}
		sleep = int(c.Lifecycle.PreStop.Sleep.Seconds)
	}
	if sleep != v.int(t, "preStopSleepSeconds") {
		t.Fatalf("preStop sleep %ds, values say %d", sleep, v.int(t, "preStopSleepSeconds"))
	}
	tgps := pod.Spec.TerminationGracePeriodSeconds
	if tgps == nil || float64(*tgps) <= float64(sleep)+grace.Seconds() {
		t.Fatalf("terminationGracePeriodSeconds %v must exceed the preStop sleep %ds + shutdown_grace %v", tgps, sleep, grace)
	}

	// Services: HTTP to the pods; the registry headless, listing unready pods.
	var httpSvc, regSvc *corev1.Service
	for _, s := range r.services {
		if !selects(s.Spec.Selector, pod.Labels) {
			continue
		}
		switch {
		case s.Spec.ClusterIP == corev1.ClusterIPNone:
			regSvc = s
		default:
			httpSvc = s
		}
	}
	if httpSvc == nil || len(httpSvc.Spec.Ports) != 1 || httpSvc.Spec.Ports[0].TargetPort.String() != "http" {
		t.Fatalf("HTTP Service %+v", httpSvc)
	}
	if regSvc == nil || !regSvc.Spec.PublishNotReadyAddresses || len(regSvc.Spec.Ports) != 1 ||
		regSvc.Spec.Ports[0].TargetPort.String() != "registry" || regSvc.Spec.Ports[0].Port != ports["registry"] {
		t.Fatalf("registry Service %+v: headless, publishing not-ready pods, on the registry port", regSvc)
	}

	// PodDisruptionBudget.
	if v.bool(t, "podDisruptionBudget.enabled") {
		if len(r.pdbs) != 1 || !selects(r.pdbs[0].Spec.Selector.MatchLabels, pod.Labels) || r.pdbs[0].Spec.MaxUnavailable == nil {
			t.Fatalf("PodDisruptionBudget %+v", r.pdbs)
		}
	} else if len(r.pdbs) != 0 {
		t.Fatal("a PodDisruptionBudget although disabled")
	}

	// ServiceMonitor: required fields, selecting the HTTP Service's labels, scraping /metrics.
	if v.bool(t, "serviceMonitor.enabled") {
		if len(r.serviceMonitor) != 1 {
			t.Fatalf("%d ServiceMonitors", len(r.serviceMonitor))
		}
		checkServiceMonitor(t, r.serviceMonitor[0], httpSvc)
	} else if len(r.serviceMonitor) != 0 {
		t.Fatal("a ServiceMonitor although disabled")
	}

	// etcd: [cluster] iff one is configured; the in-release StatefulSet's members are the
	// endpoints.
	external := asSlice(v.get(t, "etcd.externalEndpoints"))
	inRelease := v.bool(t, "etcd.enabled")
	if cfg.Cluster.Enabled != (inRelease || len(external) > 0) {
		t.Fatalf("[cluster] enabled = %v, values: etcd.enabled %v, externalEndpoints %v", cfg.Cluster.Enabled, inRelease, external)
	}
	if v.int(t, "replicaCount") > 1 && !cfg.Cluster.Enabled {
		t.Fatal("several replicas without [cluster]")
	}
	if !inRelease {
		if len(r.statefulSets) != 0 {
			t.Fatal("an etcd StatefulSet although etcd.enabled is false")
		}
		if len(external) > 0 && fmt.Sprint(cfg.Cluster.EtcdEndpoints) != fmt.Sprint(external) {
			t.Fatalf("etcd_endpoints %v, values say %v", cfg.Cluster.EtcdEndpoints, external)
		}
		return cfg
	}
	if len(r.statefulSets) != 1 {
		t.Fatalf("%d StatefulSets", len(r.statefulSets))
	}
	ss := r.statefulSets[0]
	n := v.int(t, "etcd.replicas")
	if ss.Spec.Replicas == nil || int(*ss.Spec.Replicas) != n || len(cfg.Cluster.EtcdEndpoints) != n {
		t.Fatalf("etcd: %v members, %d endpoints, values say %d", ss.Spec.Replicas, len(cfg.Cluster.EtcdEndpoints), n)
	}
	var etcdSvc *corev1.Service
	for _, s := range r.services {
		if s.Name == ss.Spec.ServiceName {
			etcdSvc = s
		}
	}
	if etcdSvc == nil || etcdSvc.Spec.ClusterIP != corev1.ClusterIPNone || !selects(etcdSvc.Spec.Selector, ss.Spec.Template.Labels) || !etcdSvc.Spec.PublishNotReadyAddresses {
		t.Fatalf("etcd's governing Service %q: headless, selecting its pods, publishing not-ready members: %+v", ss.Spec.ServiceName, etcdSvc)
	}
	for i, ep := range cfg.Cluster.EtcdEndpoints {
		want := fmt.Sprintf("%s-%d.%s.%s.svc.", ss.Name, i, ss.Spec.ServiceName, ss.Namespace)
		if !strings.HasPrefix(ep, want) || !strings.HasSuffix(ep, ":2379") {
			t.Fatalf("etcd endpoint %q: want member %d's stable name %s…:2379", ep, i, want)
		}
	}
	checkPodSecurity(t, ss.Spec.Template.Spec, "etcd")
	if len(ss.Spec.VolumeClaimTemplates) != 1 {
		t.Fatal("etcd keeps its data on a PersistentVolumeClaim")
	}
	return cfg
}

// checkPodSecurity: non-root with a numeric UID, no privilege escalation, every capability
// dropped, a read-only root filesystem.
func checkPodSecurity(t *testing.T, spec corev1.PodSpec, what string) {
	t.Helper()
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		t.Fatalf("%s pod securityContext %+v: runAsNonRoot with a non-zero runAsUser", what, psc)
	}
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		sc := c.SecurityContext
		if sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			(sc.Privileged != nil && *sc.Privileged) ||
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
			t.Fatalf("%s container %s securityContext %+v", what, c.Name, sc)
		}
	}
}

func checkServiceMonitor(t *testing.T, sm map[string]any, httpSvc *corev1.Service) {
	t.Helper()
	str := func(m map[string]any, k string) string {
		s, ok := m[k].(string)
		if !ok || s == "" {
			t.Fatalf("ServiceMonitor: %s is required, got %v", k, m[k])
		}
		return s
	}
	obj := func(m map[string]any, k string) map[string]any {
		o, ok := m[k].(map[string]any)
		if !ok {
			t.Fatalf("ServiceMonitor: %s is required (an object), got %v", k, m[k])
		}
		return o
	}
	str(obj(sm, "metadata"), "name")
	spec := obj(sm, "spec")
	for k := range spec {
		if !slices.Contains([]string{"selector", "namespaceSelector", "endpoints"}, k) {
			t.Fatalf("ServiceMonitor: unexpected spec.%s", k)
		}
	}
	ml := obj(obj(spec, "selector"), "matchLabels")
	want := map[string]string{}
	for k, v := range ml {
		want[k], _ = v.(string)
	}
	if !selects(want, httpSvc.Labels) {
		t.Fatalf("ServiceMonitor selects %v; the HTTP Service has %v", want, httpSvc.Labels)
	}
	eps, ok := spec["endpoints"].([]any)
	if !ok || len(eps) != 1 {
		t.Fatalf("ServiceMonitor endpoints %v", spec["endpoints"])
	}
	ep, _ := eps[0].(map[string]any)
	if str(ep, "port") != httpSvc.Spec.Ports[0].Name || str(ep, "path") != "/metrics" {
		t.Fatalf("ServiceMonitor endpoint %v: the HTTP Service's port, /metrics", ep)
	}
	for k := range ep {
		if !slices.Contains([]string{"port", "path", "interval"}, k) {
			t.Fatalf("ServiceMonitor: unexpected endpoints[0].%s", k)
		}
	}
}

// selects reports whether a selector's labels are all among labels (and it is not empty).
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func asSlice(x any) []any {
	s, _ := x.([]any)
	return s
}

// Decoding is strict: the check that guards every rendering above fails on a field the
// Kubernetes type does not have and on a duplicate key.
func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replica: 3}\n",
		"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nmetadata: {name: y}\n",
	} {
		if err := yaml.UnmarshalStrict([]byte(doc), &appsv1.Deployment{}); err == nil {
			t.Fatalf("strict decoding took %q", doc)
		}
	}
	var ok appsv1.Deployment
	if err := yaml.UnmarshalStrict([]byte("apiVersion: apps/v1\nkind: Deployment\nspec: {replicas: 3}\n"), &ok); err != nil || *ok.Spec.Replicas != 3 {
		t.Fatalf("strict decoding of a valid Deployment: %v", err)
	}
	b, _ := json.Marshal(ok.Spec)
	if !bytes.Contains(b, []byte(`"replicas":3`)) {
		t.Fatalf("%s", b)
	}
}
