package admission

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// testPolicy is a policy that reads cached tokens.
type testPolicy struct{ gatePolicy }

func (testPolicy) NeedsPrefixIndex() bool { return true }

func TestRegistry(t *testing.T) {
	var gotNow func() time.Time
	Register("test_registry", func(raw map[string]any, env Env) (Policy, error) {
		gotNow = env.Now
		o := NewOptions(raw)
		n := 0
		o.Int("n", &n, 1)
		if err := o.Err(); err != nil {
			return nil, err
		}
		return testPolicy{}, nil
	})
	// The registry is the package's; the entry goes with the test so that -count=N repeats it.
	t.Cleanup(func() {
		registry.Lock()
		delete(registry.byName, "test_registry")
		registry.Unlock()
	})
	if !slices.Contains(Names(), "test_registry") || !slices.IsSorted(Names()) {
		t.Fatalf("Names() = %v", Names())
	}
	p, err := NewPolicy("test_registry", map[string]any{"n": int64(2)}, Env{})
	if err != nil || !NeedsPrefixIndex(p) {
		t.Fatalf("NewPolicy: %v, %v", p, err)
	}
	if gotNow == nil {
		t.Fatal("a nil Env.Now must reach the factory as time.Now")
	}
	if _, err := NewPolicy("test_registry", map[string]any{"n": int64(0)}, Env{}); err == nil ||
		err.Error() != "admission.classifier.n: must be >= 1" {
		t.Fatalf("bad option: %v", err)
	}

	_, err = NewPolicy("fifo", nil, Env{})
	var oe *OptionError
	if !errors.As(err, &oe) || oe.Key != "type" || !strings.HasPrefix(oe.Message, `"fifo" is not one of `) ||
		!strings.Contains(oe.Message, `"test_registry"`) {
		t.Fatalf("unknown classifier: %v", err)
	}

	for _, bad := range []struct {
		name string
		f    Factory
	}{{"test_registry", DefaultFactory}, {"", DefaultFactory}, {"test_nil", nil}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("Register(%q) did not panic", bad.name)
				}
			}()
			Register(bad.name, bad.f)
		}()
	}
}

func TestDefaultFactory(t *testing.T) {
	p, err := DefaultFactory(nil, Env{})
	if p != nil || err != nil || NeedsPrefixIndex(p) {
		t.Fatalf("default: %v, %v", p, err)
	}
	if _, err := DefaultFactory(map[string]any{"workers": int64(2)}, Env{}); err == nil ||
		err.Error() != "admission.classifier.workers: unknown key" {
		t.Fatalf("default with a key: %v", err)
	}
}

// TestOptions: each reader's rules and messages, absent keys keep their defaults, bad values
// keep them too, and Err lists every problem by key, unknown keys included.
func TestOptions(t *testing.T) {
	raw := map[string]any{
		"i": int64(3), "f": 2.0, "frac": 1.5, "neg": int64(-1), "istr": "3",
		"b": false, "bnum": int64(1),
		"d": "1.5s", "dz": "0s", "dneg": "-1s", "dbad": "2 parsecs", "dnum": int64(5), "dgo": 2 * time.Second,
		"zero": "0s", "extra": true, "also": map[string]any{},
	}
	o := NewOptions(raw)
	i, f, frac, neg, istr, missing := 0, 0, 7, 7, 7, 9
	o.Int("i", &i, 0)
	o.Int("f", &f, 0)
	o.Int("frac", &frac, 0)
	o.Int("neg", &neg, 0)
	o.Int("istr", &istr, 0)
	o.Int("missing", &missing, 0)
	b, bnum := true, true
	o.Bool("b", &b)
	o.Bool("bnum", &bnum)
	var d, dz, dneg, dbad, dnum, dgo, zero time.Duration
	o.Duration("d", &d, false)
	o.Duration("dz", &dz, true)
	o.Duration("dneg", &dneg, true)
	o.Duration("dbad", &dbad, true)
	o.Duration("dnum", &dnum, true)
	o.Duration("dgo", &dgo, false)
	o.Duration("zero", &zero, false)
	if !o.Has("i") || o.Has("nope") {
		t.Fatal("Has")
	}
	if i != 3 || f != 2 || frac != 7 || neg != 7 || istr != 7 || missing != 9 || b || !bnum ||
		d != 1500*time.Millisecond || dz != 0 || dgo != 2*time.Second {
		t.Fatalf("values: %d %d %d %d %d %d %v %v %v %v %v", i, f, frac, neg, istr, missing, b, bnum, d, dz, dgo)
	}
	want := strings.Join([]string{
		"admission.classifier.also: unknown key",
		`admission.classifier.bnum: must be a boolean, not a number`,
		`admission.classifier.dbad: "2 parsecs" is not a duration`,
		`admission.classifier.dneg: must be >= 0`,
		`admission.classifier.dnum: 5 is not a duration`,
		"admission.classifier.extra: unknown key",
		"admission.classifier.frac: must be an integer, not a number",
		`admission.classifier.istr: must be an integer, not a string`,
		"admission.classifier.neg: must be >= 0",
		"admission.classifier.zero: must be > 0",
	}, "\n")
	if err := o.Err(); err == nil || err.Error() != want {
		t.Fatalf("Err():\n%v\nwant:\n%s", err, want)
	}
	if err := NewOptions(nil).Err(); err != nil {
		t.Fatalf("no keys: %v", err)
	}
}

// TestAsIntBounds: a float is an integer only when whole and inside int's range (2^63 is not).
func TestAsIntBounds(t *testing.T) {
	for _, c := range []struct {
		v  any
		n  int
		ok bool
	}{
		{9.223372036854775807e18, 0, false}, // 2^63 once a float
		{-9.223372036854775808e18, math.MinInt, true},
		{-1e19, 0, false},
		{4.0, 4, true},
		{4.5, 0, false},
		{int64(7), 7, true},
		{int32(-2), -2, true},
		{"3", 0, false},
	} {
		if n, ok := asInt(c.v); n != c.n || ok != c.ok {
			t.Fatalf("asInt(%v) = %d, %v; want %d, %v", c.v, n, ok, c.n, c.ok)
		}
	}
}

// TestOptionsFloat: a finite number in range is read (an integer too); anything else is a
// problem naming the key, and leaves the destination as it was.
func TestOptionsFloat(t *testing.T) {
	o := NewOptions(map[string]any{"f": 0.5, "i": int64(1), "hi": 1.5, "lo": -0.1, "s": "half", "inf": math.Inf(1), "nan": math.NaN()})
	f, i, keep := 0.0, 0.0, 0.25
	o.Float("f", &f, 0, 1)
	o.Float("i", &i, 0, 1)
	for _, k := range []string{"hi", "lo", "s", "inf", "nan"} {
		o.Float(k, &keep, 0, 1)
	}
	o.Float("absent", &keep, 0, 1)
	if f != 0.5 || i != 1 || keep != 0.25 {
		t.Fatalf("f %v, i %v, keep %v", f, i, keep)
	}
	err := o.Err()
	for _, want := range []string{"hi: must be between 0 and 1", "lo: must be between 0 and 1", "s: must be a number, not a string",
		"inf: must be a finite number", "nan: must be a finite number"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
}
