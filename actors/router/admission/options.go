package admission

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
)

// Options reads a classifier's own keys from its raw table (see Factory) and collects a
// problem per bad key, so a factory states its keys, defaults and rules in a few lines and
// reports them all at once:
//
//	o := admission.NewOptions(raw)
//	cfg := Config{Workers: 1}                   // the defaults
//	o.Int("workers", &cfg.Workers, 0)           // "admission.classifier.workers: must be >= 0"
//	o.Duration("max_wait", &cfg.MaxWait, false) // "…: must be > 0"
//	if err := o.Err(); err != nil {             // adds "unknown key" for every key not read
//		return nil, err
//	}
//
// A key that is absent leaves its destination as it is (the default). A value of the wrong
// type or out of range leaves it too, and is reported.
type Options struct {
	raw  map[string]any
	read map[string]bool
	errs []*OptionError
}

// NewOptions reads raw (nil: no keys).
func NewOptions(raw map[string]any) *Options {
	return &Options{raw: raw, read: make(map[string]bool)}
}

// get marks key as known and returns its value.
func (o *Options) get(key string) (any, bool) {
	o.read[key] = true
	v, ok := o.raw[key]
	return v, ok
}

// Has reports whether key is given (and marks it known).
func (o *Options) Has(key string) bool {
	_, ok := o.get(key)
	return ok
}

// Fail reports a problem with key.
func (o *Options) Fail(key, format string, args ...any) {
	o.errs = append(o.errs, &OptionError{Key: key, Message: fmt.Sprintf(format, args...)})
}

// Int reads an integer that must be >= least. An integral float counts as an integer (TOML's
// 2.0, or a number decoded from JSON).
func (o *Options) Int(key string, dst *int, least int) {
	v, ok := o.get(key)
	if !ok {
		return
	}
	n, isInt := asInt(v)
	switch {
	case !isInt:
		o.Fail(key, "must be an integer, not %s", kindOf(v))
	case n < least:
		o.Fail(key, "must be >= %d", least)
	default:
		*dst = n
	}
}

// Float reads a finite number in [least, most] (an integer counts as one).
func (o *Options) Float(key string, dst *float64, least, most float64) {
	v, ok := o.get(key)
	if !ok {
		return
	}
	var f float64
	switch x := v.(type) {
	case float64:
		f = x
	case int64:
		f = float64(x)
	case int:
		f = float64(x)
	default:
		o.Fail(key, "must be a number, not %s", kindOf(v))
		return
	}
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0):
		o.Fail(key, "must be a finite number")
	case f < least || f > most:
		o.Fail(key, "must be between %g and %g", least, most)
	default:
		*dst = f
	}
}

// Bool reads a boolean.
func (o *Options) Bool(key string, dst *bool) {
	v, ok := o.get(key)
	if !ok {
		return
	}
	b, isBool := v.(bool)
	if !isBool {
		o.Fail(key, "must be a boolean, not %s", kindOf(v))
		return
	}
	*dst = b
}

// Duration reads a duration written as Go writes one ("1.5s", "2m"; a time.Duration is taken
// as it is). It must be > 0, or >= 0 when zero is allowed.
func (o *Options) Duration(key string, dst *time.Duration, zeroOK bool) {
	v, ok := o.get(key)
	if !ok {
		return
	}
	var d time.Duration
	switch x := v.(type) {
	case time.Duration:
		d = x
	case string:
		var err error
		if d, err = time.ParseDuration(x); err != nil {
			o.Fail(key, "%q is not a duration", x)
			return
		}
	default:
		o.Fail(key, "%s is not a duration", showValue(v))
		return
	}
	switch {
	case zeroOK && d < 0:
		o.Fail(key, "must be >= 0")
	case !zeroOK && d <= 0:
		o.Fail(key, "must be > 0")
	default:
		*dst = d
	}
}

// Err is every problem found, one *OptionError per key (joined with errors.Join, by key),
// with "unknown key" for each key of the table that was never read; nil when there is none.
func (o *Options) Err() error {
	errs := slices.Clone(o.errs)
	for k := range o.raw {
		if !o.read[k] {
			errs = append(errs, &OptionError{Key: k, Message: "unknown key"})
		}
	}
	slices.SortStableFunc(errs, func(a, b *OptionError) int { return cmp.Compare(a.Key, b.Key) })
	out := make([]error, len(errs))
	for i, e := range errs {
		out[i] = e
	}
	return errors.Join(out...)
}

// asInt converts the integer kinds TOML, JSON and Go callers produce.
func asInt(v any) (int, bool) {
	switch x := v.(type) {
	case int:
		return x, true
	case int64:
		return int(x), int64(int(x)) == x
	case int32:
		return int(x), true
	case float64:
		if x != math.Trunc(x) || x < math.MinInt || x >= math.MaxInt {
			return 0, false
		}
		return int(x), true
	}
	return 0, false
}

// kindOf names a value's type in TOML terms, with an article.
func kindOf(v any) string {
	switch v.(type) {
	case int, int32, int64, float64:
		return "a number"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case map[string]any:
		return "a table"
	case []any:
		return "an array"
	case nil:
		return "nothing"
	default:
		return fmt.Sprintf("a %T", v)
	}
}

// showValue renders a value as it would be written in TOML.
func showValue(v any) string {
	switch x := v.(type) {
	case string:
		return strconv.Quote(x)
	case map[string]any, []any, nil:
		return kindOf(v)
	default:
		return fmt.Sprint(x)
	}
}
