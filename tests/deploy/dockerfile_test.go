package deploy

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const repoRoot = "../.."

// instruction is one Dockerfile instruction with its continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, …
	args string
}

// parseDockerfile reads the instructions of a Dockerfile (comments and blank lines dropped,
// backslash continuations joined); it is enough for the checks below, not a full parser.
func parseDockerfile(t *testing.T, path string) []instruction {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []instruction
	var cur strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() { // bounded by the file
		line := strings.TrimSpace(sc.Text())
		if cur.Len() == 0 && (line == "" || strings.HasPrefix(line, "#")) {
			continue
		}
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\") + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args)})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestDockerfile: a multi-stage build of a static cmd/tlgw (cgo off, -trimpath) on the
// toolchain go.mod names, a distroless-static (or scratch) final stage running as a numeric
// non-root user, the HTTP and registry ports exposed, and the entrypoint serving the config
// the chart mounts.
func TestDockerfile(t *testing.T) {
	ins := parseDockerfile(t, filepath.Join(repoRoot, "Dockerfile"))
	var froms []string
	var final []instruction // the last stage's instructions
	var build string
	for _, in := range ins {
		switch in.cmd {
		case "FROM":
			froms = append(froms, in.args)
			final = nil
		case "RUN":
			if strings.Contains(in.args, "go build") {
				build = in.args
			}
		}
		final = append(final, in)
	}
	if len(froms) < 2 {
		t.Fatalf("a multi-stage build, got FROM %v", froms)
	}
	goMod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(goMod)
	if goVersion == nil || !strings.HasPrefix(froms[0], "golang:"+string(goVersion[1])+"-") {
		t.Fatalf("the build stage %q must use go.mod's toolchain go %s", froms[0], goVersion[1])
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "./cmd/tlgw"} {
		if !strings.Contains(build, want) {
			t.Fatalf("the build %q lacks %s", build, want)
		}
	}
	last := froms[len(froms)-1]
	if !strings.HasPrefix(last, "gcr.io/distroless/static") && last != "scratch" {
		t.Fatalf("final stage %q: distroless static or scratch", last)
	}
	var user string
	var expose []string
	var entry []string
	for _, in := range final {
		switch in.cmd {
		case "USER":
			user = in.args
		case "EXPOSE":
			expose = append(expose, strings.Fields(in.args)...)
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &entry); err != nil {
				t.Fatalf("ENTRYPOINT %s: the exec (JSON) form, the image has no shell: %v", in.args, err)
			}
		case "RUN":
			t.Fatalf("RUN %s in the final stage: it has no shell", in.args)
		}
	}
	uid, gid, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		t.Fatalf("USER %q: a numeric non-root UID (Kubernetes' runAsNonRoot checks it)", user)
	}
	if gid != "" {
		if _, err := strconv.Atoi(gid); err != nil {
			t.Fatalf("USER %q: a numeric group", user)
		}
	}
	// The chart runs the same UID.
	vals := loadValues(t, filepath.Join(chartDir, "values.yaml"))
	for _, p := range []string{"http", "registry"} {
		if !slices.Contains(expose, strconv.Itoa(vals.int(t, "ports."+p))) {
			t.Fatalf("EXPOSE %v lacks the %s port %d", expose, p, vals.int(t, "ports."+p))
		}
	}
	if len(entry) != 4 || filepath.Base(entry[0]) != "tlgw" || !slices.Equal(entry[1:], []string{"serve", "--config", "/etc/tlgw/tlgw.toml"}) {
		t.Fatalf("ENTRYPOINT %v: tlgw serve --config /etc/tlgw/tlgw.toml", entry)
	}
	dep, err := os.ReadFile(filepath.Join(chartDir, "templates", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(dep, []byte("runAsUser: "+uid)) {
		t.Fatalf("the chart's pods must run as the image's UID %s", uid)
	}
}

// TestDockerignoreKeepsTheBuild: nothing the binary is built from is left out of the build
// context.
func TestDockerignoreKeepsTheBuild(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	var ignored []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			ignored = append(ignored, strings.TrimPrefix(l, "**/"))
		}
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.Dir}} {{join .EmbedFiles \" \"}}{{end}}", "../../cmd/tlgw").Output()
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		rel, err := filepath.Rel(root, fields[0])
		if err != nil || strings.HasPrefix(rel, "..") {
			continue // a module outside the repository
		}
		n++
		paths := []string{rel}
		for _, e := range fields[1:] {
			paths = append(paths, filepath.Join(rel, e))
		}
		for _, p := range paths {
			for _, seg := range strings.Split(filepath.ToSlash(p), "/") {
				if slices.Contains(ignored, seg) {
					t.Fatalf("%s is built into tlgw but .dockerignore leaves out %q", p, seg)
				}
			}
		}
	}
	if n < 10 {
		t.Fatalf("only %d of the repository's packages in tlgw's build", n)
	}
}

// TestStaticBinary: cmd/tlgw builds as the Dockerfile builds it, into a static executable
// (no interpreter, no shared libraries) that carries no build path and runs.
func TestStaticBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "tlgw")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version=deploy-test", "-o", bin, "./cmd/tlgw")
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build -trimpath: %v\n%s", err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Fatalf("the binary is dynamically linked (%v)", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) != 0 {
		t.Fatalf("the binary needs %v", libs)
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte(root+"/")) {
		t.Fatalf("the binary holds the build path %s: -trimpath did not apply", root)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil || strings.TrimSpace(string(out)) != "tlgw deploy-test" {
		t.Fatalf("tlgw version: %q %v", out, err)
	}
	t.Logf("static tlgw: %d bytes", len(data))
}
