package server

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/hutch-dev/hutch/internal/sandbox"
)

// metrics are the daemon's Prometheus series, on a registry of its own so
// tests can run several servers in one process.
type metrics struct {
	reg      *prometheus.Registry
	states   *prometheus.GaugeVec
	execs    *prometheus.CounterVec
	execTime *prometheus.HistogramVec
	errors   *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		states: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "hutch_sandboxes", Help: "Sandboxes by state."}, []string{"state"}),
		execs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hutch_exec_total", Help: "Commands run, by kind (buffered, stream, websocket, process)."}, []string{"kind"}),
		execTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "hutch_exec_duration_seconds", Help: "Buffered exec latency, request to result.",
			Buckets: []float64{.001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 5, 30, 300}}, []string{"kind"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hutch_errors_total", Help: "Error responses by code."}, []string{"code"}),
	}
	m.reg.MustRegister(m.states, m.execs, m.execTime, m.errors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// transition keeps the per-state gauge in step with the manager.
func (m *metrics) transition(from, to sandbox.State) {
	if from != "" {
		m.states.WithLabelValues(string(from)).Dec()
	}
	if to != "" {
		m.states.WithLabelValues(string(to)).Inc()
	}
}

// SeedStates sets the gauge from counts (at start-up).
func (s *Server) SeedStates(counts map[sandbox.State]int) {
	for st, n := range counts {
		s.metrics.states.WithLabelValues(string(st)).Set(float64(n))
	}
}

// Register adds collectors (another part's metrics) to /metrics.
func (s *Server) Register(cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := s.metrics.reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
