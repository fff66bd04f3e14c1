package metrics

import "github.com/prometheus/client_golang/prometheus"

// Console holds the collectors of the operator console (`consumer
// console`). A nil *Console counts nothing.
type Console struct {
	Requests       *prometheus.CounterVec
	RequestSeconds *prometheus.HistogramVec
}

// NewConsole creates the console's collectors and registers them on reg.
func NewConsole(reg prometheus.Registerer) *Console {
	c := &Console{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "promptline_console_requests_total", Help: "Requests served by the operator console, by route and status code.",
		}, []string{"route", "code"}),
		RequestSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "promptline_console_request_seconds", Help: "Latency of the operator console's requests, by route.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}, []string{"route"}),
	}
	reg.MustRegister(c.Requests, c.RequestSeconds)
	return c
}

// Observe counts one request.
func (c *Console) Observe(route string, code int, seconds float64) {
	if c == nil {
		return
	}
	c.Requests.WithLabelValues(route, codeLabel(code)).Inc()
	c.RequestSeconds.WithLabelValues(route).Observe(seconds)
}

func codeLabel(code int) string {
	const digits = "0123456789"
	if code < 100 || code > 999 {
		return "other"
	}
	return string([]byte{digits[code/100], digits[code/10%10], digits[code%10]})
}
