package config

// fileGatewayFaults is the [gateway] keys of engine faults (R14.1 timeouts, R14.3 retry budget).
type fileGatewayFaults struct {
	StreamFirstByteTimeout *string      `json:"stream_first_byte_timeout"`
	RequestTimeout         *string      `json:"request_timeout"`
	StreamIdleTimeout      *string      `json:"stream_idle_timeout"`
	ControlTimeout         *string      `json:"control_timeout"`
	RetryBudgetPercent     *float64     `json:"retry_budget_percent"`
	Outlier                *fileOutlier `json:"outlier"`
}

// fileOutlier is [gateway.outlier] (R14.2).
type fileOutlier struct {
	ConsecutiveFailures *int     `json:"consecutive_failures"`
	BaseEjection        *string  `json:"base_ejection"`
	MaxEjection         *string  `json:"max_ejection"`
	MaxEjectedPercent   *float64 `json:"max_ejected_percent"`
}

func (fo *fileOutlier) apply(o *Outlier, base path, ps *problems) {
	if fo == nil {
		return
	}
	if fo.ConsecutiveFailures != nil {
		if n := *fo.ConsecutiveFailures; n < 0 {
			ps.add(base.with(key("consecutive_failures")), "must be at least 0")
		} else {
			o.ConsecutiveFailures = n
		}
	}
	duration(&o.BaseEjection, fo.BaseEjection, base.with(key("base_ejection")), ps)
	duration(&o.MaxEjection, fo.MaxEjection, base.with(key("max_ejection")), ps)
	if fo.MaxEjectedPercent != nil {
		if p := *fo.MaxEjectedPercent; p < 0 || p > 100 {
			ps.add(base.with(key("max_ejected_percent")), "must be between 0 and 100")
		} else {
			o.MaxEjectedPercent = p
		}
	}
	if o.MaxEjection < o.BaseEjection {
		ps.add(base.with(key("max_ejection")), "must be at least base_ejection (%v)", o.BaseEjection)
	}
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
	ff.Outlier.apply(&g.Outlier, base.with(key("outlier")), ps)
}
