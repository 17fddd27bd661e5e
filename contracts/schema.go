// Package contracts holds the project's wire and file contracts: the .proto
// sources with their generated Go (under tl/), and the JSON Schema of the
// runtime configuration.
package contracts

import _ "embed"

// RuntimeSchema is runtime.schema.json: the JSON Schema (draft 2020-12) that
// the TOML configuration of `tlgw serve`, read as JSON, must satisfy.
//
//go:embed runtime.schema.json
var RuntimeSchema []byte
