package tracing

import (
	"fmt"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// Bounds on Options.Headers (the [tracing] headers and headers_env): at most MaxHeaders, each
// name 1 to MaxHeaderNameLen bytes, each value 1 to MaxHeaderValueLen bytes — an export
// carries at most 32 × (64 + 4096) bytes of them.
const (
	MaxHeaders        = 32
	MaxHeaderNameLen  = 64
	MaxHeaderValueLen = 4096
)

// reservedHeaders are set by gRPC or HTTP/2 themselves; a configured one would be refused by
// gRPC or break the call.
var reservedHeaders = map[string]bool{
	"content-type": true, "te": true, "user-agent": true, "host": true, "connection": true,
	"transfer-encoding": true, "keep-alive": true, "proxy-connection": true, "upgrade": true,
}

// CheckHeaderName reports why name cannot be a header sent with every export: it must be an
// HTTP header token of 1 to MaxHeaderNameLen bytes, not one gRPC reserves (grpc-*, *-bin,
// content-type, te, user-agent, hop-by-hop headers). Names are case-insensitive; gRPC sends
// them lowercase.
func CheckHeaderName(name string) error {
	if name == "" || len(name) > MaxHeaderNameLen || !httpguts.ValidHeaderFieldName(name) {
		return fmt.Errorf("header name %q is not an HTTP header token of 1 to %d characters", truncate(name, MaxHeaderNameLen), MaxHeaderNameLen)
	}
	low := strings.ToLower(name)
	if strings.HasPrefix(low, "grpc-") || strings.HasSuffix(low, "-bin") || reservedHeaders[low] {
		return fmt.Errorf("header %s is reserved by gRPC", name)
	}
	return nil
}

// errHeaderValue never holds the value: it is usually a credential.
var errHeaderValue = fmt.Errorf("the value must be 1 to %d printable ASCII characters (spaces allowed)", MaxHeaderValueLen)

// CheckHeaderValue reports why v cannot be a header's value: 1 to MaxHeaderValueLen printable
// ASCII characters, spaces allowed (what gRPC sends in a text header). The error never quotes
// v.
func CheckHeaderValue(v string) error {
	if v == "" || len(v) > MaxHeaderValueLen {
		return errHeaderValue
	}
	for i := 0; i < len(v); i++ {
		if v[i] < ' ' || v[i] > '~' {
			return errHeaderValue
		}
	}
	return nil
}
