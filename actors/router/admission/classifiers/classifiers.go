// Package classifiers is the one table of admission classifiers: the names that
// [admission] classifier.type accepts, each with the factory that parses its keys and builds
// its policy. A classifier is one package plus one line here.
//
// The table registers itself in init, so importing this package (blank) is all a reader of
// classifier names needs: the config loader, which checks a classifier's keys while it loads
// the file, and the app, which builds the policy. Registering from an explicit call instead
// would have to happen once, before the first of those readers, in every binary and test that
// loads a configuration; a reader that forgot it would turn a valid file into "unknown
// classifier". admission.Register panics on a duplicate name, so two classifiers answering to
// one name stop the process at start-up (and every test) rather than one silently winning.
//
// contracts/runtime.schema.json documents each classifier's keys for users; a test keeps its
// list of types equal to this table.
package classifiers

import (
	"github.com/tlgw/tlgw/actors/router/admission"
	"github.com/tlgw/tlgw/actors/router/admission/coldpool"
	"github.com/tlgw/tlgw/actors/router/admission/sessionserial"
	"github.com/tlgw/tlgw/actors/router/admission/thunderagent"
)

func init() {
	admission.Register("default", admission.DefaultFactory)
	admission.Register("session_serial", sessionserial.Factory)
	admission.Register("cold_pool", coldpool.Factory)
	admission.Register("thunderagent", thunderagent.Factory)
}
