package config

// fileGatewayFaults is the [gateway] keys of engine faults (R14.1 timeouts, R14.3 retry budget).
type fileGatewayFaults struct {
	StreamFirstByteTimeout *string  `json:"stream_first_byte_timeout"`
	RequestTimeout         *string  `json:"request_timeout"`
	StreamIdleTimeout      *string  `json:"stream_idle_timeout"`
	ControlTimeout         *string  `json:"control_timeout"`
	RetryBudgetPercent     *float64 `json:"retry_budget_percent"`
}

func (ff *fileGatewayFaults) apply(g *Gateway, base path, ps *problems) {
	duration(&g.StreamFirstByteTimeout, ff.StreamFirstByteTimeout, base.with(key("stream_first_byte_timeout")), ps)
	duration(&g.RequestTimeout, ff.RequestTimeout, base.with(key("request_timeout")), ps)
	duration(&g.StreamIdleTimeout, ff.StreamIdleTimeout, base.with(key("stream_idle_timeout")), ps)
	duration(&g.ControlTimeout, ff.ControlTimeout, base.with(key("control_timeout")), ps)
	if ff.RetryBudgetPercent != nil {
		if p := *ff.RetryBudgetPercent; p < 0 || p > 100 {
			ps.add(base.with(key("retry_budget_percent")), "must be between 0 and 100")
		} else {
			g.RetryBudgetPercent = p
		}
	}
}
