package config

import (
	"strings"

	"github.com/tlgw/tlgw/internal/accesslog"
)

// AccessLog is the [access_log] table (R24): one JSON line per finished inference request
// (internal/accesslog). Without the table, or with an empty path, there is no access log.
type AccessLog struct {
	// Path is where the lines go: "" = no access log, "-" = standard output, else a file
	// opened to append (created with mode 0640).
	Path string
	// Format is the lines' format; "json" is the one there is.
	Format string
	// Buffer is how many records may wait for the log's writer (1 to 65536); a record that
	// finds it full is dropped and counted (tlgw_access_log_dropped_total).
	Buffer int
}

// AccessLogJSON is access_log.format's one value.
const AccessLogJSON = "json"

// Enabled reports whether the access log is on.
func (l AccessLog) Enabled() bool { return l.Path != "" }

func defaultAccessLog() AccessLog {
	return AccessLog{Format: AccessLogJSON, Buffer: accesslog.DefaultBuffer}
}

type fileAccessLog struct {
	Path   *string `json:"path"`
	Format *string `json:"format"`
	Buffer *int    `json:"buffer"`
}

func (fl *fileAccessLog) apply(l *AccessLog, ps *problems) {
	if fl == nil {
		return
	}
	base := path{key("access_log")}
	setIf(&l.Path, fl.Path)
	if strings.ContainsRune(l.Path, 0) {
		ps.add(base.with(key("path")), "must not hold a NUL character")
	}
	if fl.Format != nil {
		if *fl.Format != AccessLogJSON {
			ps.add(base.with(key("format")), "%q is not %q", *fl.Format, AccessLogJSON)
		}
		l.Format = *fl.Format
	}
	if fl.Buffer != nil {
		// The schema bounds it too; this keeps AccessLog's contract for any caller of apply.
		if b := *fl.Buffer; b < accesslog.MinBuffer || b > accesslog.MaxBuffer {
			ps.add(base.with(key("buffer")), "%d is not between %d and %d", b, accesslog.MinBuffer, accesslog.MaxBuffer)
		} else {
			l.Buffer = b
		}
	}
}
