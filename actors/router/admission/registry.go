package admission

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Factory builds a classifier's policy from its configuration: raw is the classifier's table
// (admission.classifier) without its type, as decoded from TOML (nil when it has no other
// keys). A factory parses and validates its own keys: every unknown key, wrong type or bad
// value is an *OptionError naming the key (several are joined with errors.Join; Options
// collects them). It returns a nil Policy for "no gate, no classification".
type Factory func(raw map[string]any, env Env) (Policy, error)

// Env is what a policy may take from the gateway besides its configuration.
type Env struct {
	// Now is the injected clock's time; nil means time.Now (the config loader builds a policy
	// only to check its options).
	Now func() time.Time
}

// registry maps classifier names (the config's classifier.type) to factories. Entries are
// added by Register from actors/router/admission/classifiers, the one table of classifiers.
var registry struct {
	sync.RWMutex
	byName map[string]Factory
}

// Register adds a classifier under name. An empty name, a nil factory or a name registered
// twice panics: two classifiers answering to one name is a programming error.
func Register(name string, f Factory) {
	registry.Lock()
	defer registry.Unlock()
	if name == "" || f == nil {
		panic(fmt.Sprintf("admission: classifier %q registered without a name or factory", name))
	}
	if _, dup := registry.byName[name]; dup {
		panic(fmt.Sprintf("admission: classifier %q registered twice", name))
	}
	if registry.byName == nil {
		registry.byName = make(map[string]Factory)
	}
	registry.byName[name] = f
}

// Names lists the registered classifiers, sorted.
func Names() []string {
	registry.RLock()
	defer registry.RUnlock()
	names := make([]string, 0, len(registry.byName))
	for n := range registry.byName {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// NewPolicy builds the policy of the classifier registered under name from its options (see
// Factory). An unknown name is an *OptionError on the key "type".
func NewPolicy(name string, raw map[string]any, env Env) (Policy, error) {
	registry.RLock()
	f, ok := registry.byName[name]
	registry.RUnlock()
	if !ok {
		var quoted []string
		for _, n := range Names() {
			quoted = append(quoted, strconv.Quote(n))
		}
		return nil, &OptionError{Key: "type",
			Message: fmt.Sprintf("%q is not one of %s", name, strings.Join(quoted, ", "))}
	}
	if env.Now == nil {
		env.Now = time.Now
	}
	return f(raw, env)
}

// DefaultFactory is the "default" classifier: no policy (the class comes from the API key or
// the X-TL-Class header only, and no gate holds a request). It takes no keys.
func DefaultFactory(raw map[string]any, _ Env) (Policy, error) {
	return nil, NewOptions(raw).Err()
}

// PrefixReader is an optional policy interface: a policy whose classifier reads cached tokens
// (Classify's cached callback) needs the router's prefix index.
type PrefixReader interface {
	NeedsPrefixIndex() bool
}

// NeedsPrefixIndex reports whether p reads cached tokens (a nil policy does not).
func NeedsPrefixIndex(p Policy) bool {
	pr, ok := p.(PrefixReader)
	return ok && pr.NeedsPrefixIndex()
}

// NeedsPrefixIndex reports whether a queue of cfg reads cached tokens: its policy does, or a
// class orders (wspt) or charges (uncached_tokens) by the uncached part of the prompt.
func (cfg Config) NeedsPrefixIndex() bool {
	for _, c := range cfg.Classes {
		if c.Order == OrderWSPT || c.Cost == CostUncachedTokens {
			return true
		}
	}
	return NeedsPrefixIndex(cfg.Policy)
}

// OptionError is a problem with one key of a classifier's table, e.g.
//
//	admission.classifier.cold_max_wait: must be > 0
type OptionError struct {
	Key     string // the key inside admission.classifier
	Message string // what is wrong with it
}

func (e *OptionError) Error() string {
	return "admission.classifier." + e.Key + ": " + e.Message
}
