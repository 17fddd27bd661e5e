package e2e

// The tests run binaries that TestMain builds, which the go test cache cannot see. Importing
// the packages those binaries are made of ties this package's cached result to their sources,
// so `go test ./...` re-runs the end-to-end tests whenever the gateway or the engine changes.
import (
	_ "github.com/tlgw/tlgw/internal/app"
	_ "github.com/tlgw/tlgw/internal/demo"
	_ "github.com/tlgw/tlgw/sim/engine"
)
