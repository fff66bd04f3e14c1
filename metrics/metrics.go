package metrics

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics holds promptline's collectors. A nil *Metrics counts nothing, so
// tests and tools may pass nil.
type Metrics struct {
	Admissions         *prometheus.CounterVec
	AdmissionBatchSize prometheus.Histogram
	AdmissionSeconds   prometheus.Histogram
	Turns              *prometheus.CounterVec
	TurnSeconds        prometheus.Histogram
	ActiveExecutions   prometheus.Gauge
	OutboxPublished    prometheus.Counter
	OutboxPruned       prometheus.Counter
	LedgerPruned       *prometheus.CounterVec
	Wakes              *prometheus.CounterVec
	Claims             *prometheus.CounterVec
	FencedWrites       prometheus.Counter
	WriteRetries       prometheus.Counter
	RecoveryDecisions  *prometheus.CounterVec
	RecoveryHeld       *prometheus.GaugeVec
	RecoveryTransient  prometheus.Counter
	RecoveryCapped     prometheus.Counter
	RecoveryDeferred   *prometheus.CounterVec
	RedrivenWakes      prometheus.Counter
	QuarantinedRows    *prometheus.GaugeVec
	OutboxPublishDelay prometheus.Histogram
	WakeToStart        prometheus.Histogram
	ProviderAttempts   *prometheus.CounterVec
	ProviderSeconds    *prometheus.HistogramVec
	// ResponseIDWriteFailures counts failed best-effort writes of a
	// provider's response ID while its attempt was in flight.
	ResponseIDWriteFailures prometheus.Counter
	// AttemptsUnknown counts provider attempts recovery reconciled as
	// unknown, by provider and model.
	AttemptsUnknown *prometheus.CounterVec
	// TokensAtRisk is the estimated input tokens of the attempts left
	// unknown, by provider and model, read from the database every
	// recovery pass.
	TokensAtRisk    *prometheus.GaugeVec
	ToolCalls       *prometheus.CounterVec
	ToolCallSeconds *prometheus.HistogramVec
	ConsumerLag     *prometheus.GaugeVec
	Deltas          *prometheus.CounterVec
}

// New creates the collectors and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "promptline_admissions_total", Help: "Prompts classified by admission.",
		}, []string{"outcome", "reason"}),
		AdmissionBatchSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "promptline_admission_batch_size", Help: "Prompts per admission transaction.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
		AdmissionSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "promptline_admission_seconds", Help: "Latency of one admission transaction.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		Turns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "promptline_turns_total", Help: "Turns finished, by outcome.",
		}, []string{"outcome"}),
		TurnSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "promptline_turn_seconds", Help: "Latency from promotion to the stored answer.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		ActiveExecutions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "promptline_active_executions", Help: "Sessions executing in this process.",
		}),
		OutboxPublished: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "promptline_outbox_published_total", Help: "Outbox rows published by this process.",
		}),
		OutboxPruned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "promptline_outbox_pruned_total", Help: "Published outbox rows deleted by this process once older than --outbox-retention.",
		}),
		LedgerPruned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "promptline_ledger_pruned_total", Help: "Ledger rows of settled executions deleted by this process once older than --ledger-retention, by table: attempts | tool_calls.",
		}, []string{"table"}),
		Wakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "promptline_wakes_total", Help: "Wakes consumed, by result.",
		}, []string{"result"}),
		Claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "promptline_claims_total", Help: "Claim events: acquired, renewed, released, lost.",
		}, []string{"event"}),
		FencedWrites: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "promptline_fenced_writes_total", Help: "Execution writes refused by the fence (stale token or expired lease).",
		}),
		WriteRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "promptline_execution_write_retries_total", Help: "Execution writes retried after a transient database error, while their lease lived.",
		}),
		RecoveryDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "promptline_recovery_decisions_total", Help: "Recovery decisions, by decision.",
		}, []string{"decision"}),
		RecoveryHeld: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "promptline_recovery_held", Help: "Everything a held recovery pass planned and left for an operator, by decision; 0 in auto.",
		}, []string{"decision"}),
		RecoveryTransient: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "promptline_recovery_transient_errors_total", Help: "Recovery decisions that failed with a transient database error and were left for the next pass.",
		}),
		RecoveryCapped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "promptline_recovery_capped_total", Help: "Expired claims quarantined with reason recovery_cap: their session's turn was run again by recovery --recovery-max-per-session times within the window.",
		}),
		RecoveryDeferred: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "promptline_recovery_deferred_total", Help: "Expired claims (kind claim) and lost wakes (kind wake) a recovery pass left for the next one for want of a --recovery-rate token.",
		}, []string{"kind"}),
		RedrivenWakes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "promptline_redriven_wakes_total", Help: "Sessions re-woken because their wake was lost.",
		}),
		QuarantinedRows: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "promptline_quarantined_rows", Help: "Quarantined rows by kind, read from the database by the recovery loop.",
		}, []string{"kind"}),
		OutboxPublishDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "promptline_outbox_publish_delay_seconds", Help: "Per published batch, the age of its oldest row when marked published: an upper bound of commit-to-publish latency.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		WakeToStart: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "promptline_wake_to_start_seconds", Help: "Latency from a wake's at (written with its outbox row) to the executor starting, or joining, the session's run.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		ProviderAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "promptline_provider_attempts_total", Help: "Provider requests sent, by outcome: succeeded, failed, unknown.",
		}, []string{"outcome"}),
		ProviderSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "promptline_provider_attempt_seconds", Help: "Latency of one provider request, by outcome.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}, []string{"outcome"}),
		ResponseIDWriteFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "promptline_provider_response_id_write_failures_total", Help: "Best-effort writes of a provider's response ID, while its attempt was in flight, that failed; the turn went on.",
		}),
		AttemptsUnknown: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "promptline_provider_attempts_unknown_total", Help: "Provider attempts that became unknown (they may have been billed), recorded so by the executor or by a recovery decision, by provider and model.",
		}, []string{"provider", "model"}),
		TokensAtRisk: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "promptline_provider_tokens_at_risk", Help: "Estimated input tokens of the provider attempts left unknown and not resolved, by provider and model, from the database, refreshed every recovery pass.",
		}, []string{"provider", "model"}),
		ToolCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "promptline_tool_calls_total", Help: "Tool calls settled, by outcome: succeeded, failed, unknown.",
		}, []string{"outcome"}),
		ToolCallSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "promptline_tool_call_seconds", Help: "Latency of one tool run, by outcome.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
		}, []string{"outcome"}),
		ConsumerLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "promptline_kafka_consumer_lag_messages", Help: "Per assigned partition, its high-water mark minus the next offset this group member will mark.",
		}, []string{"topic", "partition"}),
		Deltas: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "promptline_deltas_total", Help: "Live text deltas, by result: published (the broker acknowledged it) | dropped (producer full or failing; the turn went on).",
		}, []string{"result"}),
	}
	reg.MustRegister(m.ResponseIDWriteFailures, m.AttemptsUnknown, m.TokensAtRisk)
	reg.MustRegister(m.OutboxPublishDelay, m.WakeToStart, m.ProviderAttempts, m.ProviderSeconds, m.ToolCalls, m.ToolCallSeconds, m.ConsumerLag, m.Deltas)
	reg.MustRegister(m.RecoveryDecisions, m.RecoveryHeld, m.RecoveryTransient, m.RecoveryCapped, m.RecoveryDeferred, m.RedrivenWakes, m.QuarantinedRows, m.Claims, m.FencedWrites, m.WriteRetries, m.Admissions, m.AdmissionBatchSize, m.AdmissionSeconds, m.Turns,
		m.TurnSeconds, m.ActiveExecutions, m.OutboxPublished, m.OutboxPruned, m.LedgerPruned, m.Wakes)
	// Both tables from the start, so that a rate over them has a series
	// before the first prune.
	for _, table := range []string{"attempts", "tool_calls"} {
		m.LedgerPruned.WithLabelValues(table)
	}
	return m
}

// NewRegistry returns a registry with the Go and process collectors.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Server serves /metrics for a registry.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// ServerConfig configures the metrics and health server.
type ServerConfig struct {
	// ReadyFunc answers /readyz: nil means ready (200), an error means not
	// ready (503, the error as the reason). Defaults to always ready.
	ReadyFunc func(ctx context.Context) error
	// ReadyTimeout bounds one ReadyFunc call. Defaults to 2s.
	ReadyTimeout time.Duration
}

const readyTimeoutDefault = 2 * time.Second

// Listen binds addr and serves /metrics, /healthz (the process is alive)
// and /readyz (config.ReadyFunc) until Close. config may be nil.
func Listen(addr string, g prometheus.Gatherer, config *ServerConfig) (*Server, error) {
	var cfg ServerConfig
	if config != nil {
		cfg = *config
	}
	cfg.ReadyTimeout = cmp.Or(cfg.ReadyTimeout, readyTimeoutDefault)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if cfg.ReadyFunc != nil {
			ctx, cancel := context.WithTimeout(r.Context(), cfg.ReadyTimeout)
			defer cancel()
			if err := cfg.ReadyFunc(ctx); err != nil {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = fmt.Fprintf(w, "not ready: %v\n", err)
				return
			}
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = err // Serve fails only when the listener breaks; Close reports nothing more useful.
		}
	}()
	return s, nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops serving.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}
