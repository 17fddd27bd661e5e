// Package ui drives the operator page of R17.1 (GET /ui) in headless Chromium against real
// tlgw and tlengine processes on loopback.
package ui

import (
	"testing"

	"github.com/tlgw/tlgw/internal/proctest"
)

var tlgwBin, tlengineBin string

func TestMain(m *testing.M) { proctest.RunWithBinaries(m, &tlgwBin, &tlengineBin) }
