package admission

import (
	"fmt"
	"time"
)

// PolicyOptions are the classifier settings of the configuration.
type PolicyOptions struct {
	ColdPool ColdPoolConfig
	Now      func() time.Time
}

// policies maps classifier names (the config's classifier.type) to constructors: the one
// table where admission policies are registered.
var policies = map[string]func(PolicyOptions) Policy{
	"default":        func(PolicyOptions) Policy { return nil },
	"session_serial": func(PolicyOptions) Policy { return NewSessionSerial() },
	"cold_pool":      func(o PolicyOptions) Policy { return NewColdPool(o.ColdPool, o.Now) },
}

// NewPolicy builds the policy registered under name; "default" is nil (classification by the
// key or header only, no gate).
func NewPolicy(name string, o PolicyOptions) (Policy, error) {
	mk, ok := policies[name]
	if !ok {
		return nil, fmt.Errorf("admission: unknown classifier %q", name)
	}
	return mk(o), nil
}
