package config

import "fmt"

// DefaultMaxBufferedBytes is gateway.max_buffered_bytes' default (R20): 1 GiB.
const DefaultMaxBufferedBytes = 1 << 30

// fileGatewayHTTP is the [gateway] keys of the HTTP trust boundary (R13.3).
type fileGatewayHTTP struct {
	AllowUnauthenticated *bool   `json:"allow_unauthenticated"`
	MaxInFlight          *int    `json:"max_in_flight"`
	MaxBufferedBytes     *int64  `json:"max_buffered_bytes"`
	IdleTimeout          *string `json:"idle_timeout"`
	BodyReadTimeout      *string `json:"body_read_timeout"`
	ClientWriteTimeout   *string `json:"client_write_timeout"`
}

func (fh *fileGatewayHTTP) apply(g *Gateway, base path, ps *problems) {
	setIf(&g.AllowUnauthenticated, fh.AllowUnauthenticated)
	if fh.MaxInFlight != nil {
		if *fh.MaxInFlight < 1 {
			ps.add(base.with(key("max_in_flight")), "must be >= 1")
		} else {
			g.MaxInFlight = *fh.MaxInFlight
		}
	}
	if fh.MaxBufferedBytes != nil {
		if *fh.MaxBufferedBytes < 1 {
			ps.add(base.with(key("max_buffered_bytes")), "must be >= 1")
		} else {
			g.MaxBufferedBytes = *fh.MaxBufferedBytes
		}
	}
	duration(&g.IdleTimeout, fh.IdleTimeout, base.with(key("idle_timeout")), ps)
	duration(&g.BodyReadTimeout, fh.BodyReadTimeout, base.with(key("body_read_timeout")), ps)
	duration(&g.ClientWriteTimeout, fh.ClientWriteTimeout, base.with(key("client_write_timeout")), ps)
}

// checkHTTPExposure refuses an unauthenticated http_listen outside loopback (R13.3).
func checkHTTPExposure(cfg *Config, ps *problems) {
	if err := HTTPExposure(cfg); err != nil {
		ps.add(path{key("gateway"), key("allow_unauthenticated")}, "%v", err)
	}
}

// HTTPExposure is the start-up rule of R13.3: an http_listen outside loopback with no
// [[auth.keys]] is an error unless gateway.allow_unauthenticated is true. Parse applies it;
// app.Start applies it again for configurations built in code.
func HTTPExposure(cfg *Config) error {
	g := &cfg.Gateway
	if len(cfg.Auth.Keys) > 0 || g.AllowUnauthenticated || LoopbackListen(g.HTTPListen) {
		return nil
	}
	return fmt.Errorf("gateway.http_listen %q is not a loopback address and no [[auth.keys]] are configured; anyone who reaches it could use the inference and admin APIs (set gateway.allow_unauthenticated = true to serve it anyway)", g.HTTPListen)
}
