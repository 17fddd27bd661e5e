package httpapi_test

import (
	"io"
	"log/slog"
)

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
