package config

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/contracts"
)

// TestAccessLogAbsentIsOff: without the table, and with an empty path, there is no access log;
// the defaults are the schema's.
func TestAccessLogAbsentIsOff(t *testing.T) {
	for _, src := range []string{"", "[access_log]\n", "[access_log]\npath = \"\"\nbuffer = 10\n"} {
		cfg, err := Parse([]byte(src), nil)
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		if cfg.AccessLog.Enabled() || cfg.AccessLog.Format != "json" {
			t.Errorf("%q: access log %+v", src, cfg.AccessLog)
		}
	}
	var schema struct {
		Properties struct {
			AccessLog struct {
				Properties map[string]struct {
					Default any `json:"default"`
				} `json:"properties"`
			} `json:"access_log"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(contracts.RuntimeSchema, &schema); err != nil {
		t.Fatal(err)
	}
	d := Default().AccessLog
	want := map[string]any{"path": d.Path, "format": d.Format, "buffer": float64(d.Buffer)}
	got := map[string]any{}
	for k, p := range schema.Properties.AccessLog.Properties {
		got[k] = p.Default
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("schema defaults differ from Default() (-Default +schema):\n%s", diff)
	}
}

func TestAccessLogTable(t *testing.T) {
	for src, want := range map[string]AccessLog{
		"[access_log]\npath = \"-\"\n":                                           {Path: "-", Format: "json", Buffer: 8192},
		"[access_log]\npath = \"/var/log/tlgw/access.log\"\nformat = \"json\"\n": {Path: "/var/log/tlgw/access.log", Format: "json", Buffer: 8192},
		"[access_log]\npath = \"access.log\"\nbuffer = 1\n":                      {Path: "access.log", Format: "json", Buffer: 1},
		"[access_log]\npath = \"-\"\nbuffer = 65536\n":                           {Path: "-", Format: "json", Buffer: 65536},
	} {
		cfg, err := Parse([]byte(src), nil)
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		if cfg.AccessLog != want || !cfg.AccessLog.Enabled() {
			t.Errorf("%q: %+v, want %+v", src, cfg.AccessLog, want)
		}
	}
}

func TestAccessLogProblems(t *testing.T) {
	for name, c := range map[string]struct{ toml, key, msg string }{
		"format text":   {"[access_log]\npath='-'\nformat='text'\n", "access_log.format", "json"},
		"buffer zero":   {"[access_log]\npath='-'\nbuffer=0\n", "access_log.buffer", ">= 1"},
		"buffer large":  {"[access_log]\npath='-'\nbuffer=65537\n", "access_log.buffer", "<= 65536"},
		"buffer string": {"[access_log]\npath='-'\nbuffer='8k'\n", "access_log.buffer", "integer"},
		"path number":   {"[access_log]\npath=1\n", "access_log.path", "string"},
		"path NUL":      {"[access_log]\npath=\"a\\u0000b\"\n", "access_log.path", "NUL"},
		"unknown key":   {"[access_log]\npath='-'\nrotate=true\n", "access_log.rotate", "unknown key"},
	} {
		_, err := Parse([]byte(c.toml), nil)
		if !hasProblem(err, c.key, c.msg) {
			t.Errorf("%s: %v, want a problem at %s saying %q", name, err, c.key, c.msg)
		}
	}
	// apply keeps the contract without the schema.
	var ps problems
	l := defaultAccessLog()
	(&fileAccessLog{Buffer: new(0), Format: new("csv")}).apply(&l, &ps)
	if len(ps.list) != 2 || l.Buffer != 8192 {
		t.Errorf("apply: %+v, %+v", ps.list, l)
	}
}

// hasProblem reports whether err is a *Error with a problem at key whose message holds msg.
func hasProblem(err error, key, msg string) bool {
	var ce *Error
	if !errors.As(err, &ce) {
		return false
	}
	for _, p := range ce.Problems {
		if p.Path == key && strings.Contains(p.Message, msg) {
			return true
		}
	}
	return false
}

// TestKeyNames: a key's name is its configured name, else key-<index>; never its secret.
func TestKeyNames(t *testing.T) {
	cfg, err := Parse([]byte(`
[[auth.keys]]
key = "sk-first"
scopes = ["inference"]

[[auth.keys]]
key_env = "OPS_KEY"
name = "ops-team"
scopes = ["admin"]

[[auth.keys]]
key = "sk-third"
name = "!~"
scopes = ["inference"]

[[auth.keys]]
key = "sk-fourth"
scopes = ["inference"]
`), env(map[string]string{"OPS_KEY": "sk-ops"}))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, k := range cfg.Auth.Keys {
		names = append(names, k.Name)
	}
	if diff := cmp.Diff([]string{"key-0", "ops-team", "!~", "key-3"}, names); diff != "" {
		t.Errorf("names (-want +got):\n%s", diff)
	}
	for _, k := range cfg.Auth.Keys {
		if strings.Contains(k.Name, "sk-") {
			t.Errorf("name %q holds a secret", k.Name)
		}
	}
}

func TestKeyNameProblems(t *testing.T) {
	k := func(name string) string {
		return "[[auth.keys]]\nkey = \"sk-" + strings.ReplaceAll(name, "\"", "") + "x\"\nscopes = [\"inference\"]\nname = \"" + name + "\"\n"
	}
	unnamed := func(secret string) string {
		return "[[auth.keys]]\nkey = \"" + secret + "\"\nscopes = [\"inference\"]\n"
	}
	for name, c := range map[string]struct{ toml, key, msg string }{
		"empty":           {k(""), "auth.keys[0].name", ""},
		"space":           {k("a b"), "auth.keys[0].name", ""},
		"too long":        {k(strings.Repeat("n", 65)), "auth.keys[0].name", ""},
		"not ASCII":       {k("é"), "auth.keys[0].name", ""},
		"control":         {k("a\\tb"), "auth.keys[0].name", ""},
		"duplicate":       {k("ops") + unnamed("sk-2") + k("ops"), "auth.keys[2].name", `"ops" is already the name of auth.keys[0]`},
		"default's name":  {unnamed("sk-1") + k("key-0"), "auth.keys[1].name", `"key-0" is already the default name of auth.keys[0]`},
		"default clashes": {k("key-1") + unnamed("sk-2"), "auth.keys[1]", `its default name "key-1" is already the name of auth.keys[0]`},
	} {
		_, err := Parse([]byte(c.toml), nil)
		if !hasProblem(err, c.key, c.msg) {
			t.Errorf("%s: %v, want a problem at %s saying %q", name, err, c.key, c.msg)
		}
	}
	// The semantic check stands without the schema.
	for n, ok := range map[string]bool{"a": true, strings.Repeat("n", 64): true, "!~": true,
		"": false, " ": false, "a b": false, strings.Repeat("n", 65): false, "a\x7f": false, "é": false} {
		if ValidKeyName(n) != ok {
			t.Errorf("ValidKeyName(%q) = %v, want %v", n, !ok, ok)
		}
	}
}
