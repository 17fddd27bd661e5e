// Package ui drives the operator page of R17.1 (GET /ui) in headless Chromium against real
// tlgw and tlengine processes on loopback.
package ui

import (
	"fmt"
	"os"
	"testing"

	"github.com/tlgw/tlgw/internal/proctest"
)

var tlgwBin, tlengineBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tlgw-ui-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tlgwBin, err = proctest.Build(dir, "github.com/tlgw/tlgw/cmd/tlgw")
	if err == nil {
		tlengineBin, err = proctest.Build(dir, "github.com/tlgw/tlgw/cmd/tlengine")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
