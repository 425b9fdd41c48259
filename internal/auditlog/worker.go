package auditlog

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/clock"
)

// StaleAfter is how long a row may stay unsealed before the self-check
// warns: three hourly seals missed.
const StaleAfter = 3 * time.Hour

// Metrics are the audit log's Prometheus metrics, registered on a registry
// passed in (never the global one).
type Metrics struct {
	// StaleRows is the number of rows unsealed for longer than StaleAfter
	// (bc_audit_unsealed_stale_rows); above 0 means sealing is failing.
	StaleRows prometheus.Gauge
	// OldestUnsealed is the age in seconds of the oldest unsealed row
	// (bc_audit_oldest_unsealed_seconds), 0 when none.
	OldestUnsealed prometheus.Gauge
	// SealFailures counts failed seals (bc_audit_seal_failures_total).
	SealFailures prometheus.Counter
	// SinkFailures counts failed copies to the sink (bc_audit_sink_failures_total).
	SinkFailures prometheus.Counter
}

// NewMetrics makes the metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		StaleRows:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "bc_audit_unsealed_stale_rows", Help: "Audit rows unsealed for longer than 3 hours."}),
		OldestUnsealed: prometheus.NewGauge(prometheus.GaugeOpts{Name: "bc_audit_oldest_unsealed_seconds", Help: "Age of the oldest unsealed audit row in seconds."}),
		SealFailures:   prometheus.NewCounter(prometheus.CounterOpts{Name: "bc_audit_seal_failures_total", Help: "Failed audit seals."}),
		SinkFailures:   prometheus.NewCounter(prometheus.CounterOpts{Name: "bc_audit_sink_failures_total", Help: "Failed copies to the audit sink."}),
	}
	for _, c := range []prometheus.Collector{m.StaleRows, m.OldestUnsealed, m.SealFailures, m.SinkFailures} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("auditlog: register metric: %w", err)
		}
	}
	return m, nil
}

// Unsealed is what the self-check found.
type Unsealed struct {
	Stale  int64     // rows unsealed for longer than StaleAfter
	Oldest time.Time // at of the oldest unsealed row; zero when none
}

// CheckUnsealed counts the rows older than now-maxAge that are still
// unsealed, and finds the oldest unsealed row.
func (l *Log) CheckUnsealed(ctx context.Context, maxAge time.Duration) (Unsealed, error) {
	var u Unsealed
	cutoff := l.clk.Now().Add(-maxAge).UnixMilli()
	stale, oldest, err := audit.UnnumberedAge(ctx, l.db, cutoff)
	if err != nil {
		return u, fmt.Errorf("auditlog: self-check: %w", err)
	}
	u.Stale = stale
	if oldest.Valid {
		u.Oldest = time.UnixMilli(oldest.Int64).UTC()
	}
	return u, nil
}

// Worker is the workers role's audit job: it seals every tenant's new rows
// on an interval, copies sealed rows to the sink, and warns (log and
// metric) when rows stay unsealed longer than StaleAfter.
type Worker struct {
	Log     *Log
	Key     *SigningKey
	Pump    *Pump // nil: no sink
	Metrics *Metrics
	Logger  *slog.Logger
	Clock   clock.Clock
	// SealInterval is how often to seal (default 1h); CheckInterval how
	// often to self-check (default 5m); SinkInterval how often to retry
	// copying to the sink between seals (default 1m).
	SealInterval, CheckInterval, SinkInterval time.Duration
}

// SealOnce seals every tenant, then copies to the sink.
func (w *Worker) SealOnce(ctx context.Context) error {
	if _, err := w.Log.SealAll(ctx, w.Key); err != nil {
		if w.Metrics != nil {
			w.Metrics.SealFailures.Inc()
		}
		w.logger().Error("audit seal failed", "err", err)
		return err
	}
	return w.CopyOnce(ctx)
}

// CopyOnce copies sealed rows to the sink, if there is one.
func (w *Worker) CopyOnce(ctx context.Context) error {
	if w.Pump == nil {
		return nil
	}
	if _, err := w.Pump.Run(ctx); err != nil {
		if w.Metrics != nil {
			w.Metrics.SinkFailures.Inc()
		}
		w.logger().Warn("audit sink copy delayed", "err", err)
		return err
	}
	return nil
}

// SelfCheck sets the metrics and logs a warning when rows older than
// StaleAfter are unsealed.
func (w *Worker) SelfCheck(ctx context.Context) (Unsealed, error) {
	u, err := w.Log.CheckUnsealed(ctx, StaleAfter)
	if err != nil {
		w.logger().Error("audit self-check failed", "err", err)
		return u, err
	}
	if w.Metrics != nil {
		w.Metrics.StaleRows.Set(float64(u.Stale))
		age := 0.0
		if !u.Oldest.IsZero() {
			age = w.clock().Now().Sub(u.Oldest).Seconds()
		}
		w.Metrics.OldestUnsealed.Set(age)
	}
	if u.Stale > 0 {
		w.logger().Warn("audit rows unsealed for over 3 hours", "rows", u.Stale, "oldest", u.Oldest)
	}
	return u, nil
}

// Run runs the job until ctx ends.
func (w *Worker) Run(ctx context.Context) {
	seal := time.NewTicker(orDur(w.SealInterval, time.Hour))
	check := time.NewTicker(orDur(w.CheckInterval, 5*time.Minute))
	copyT := time.NewTicker(orDur(w.SinkInterval, time.Minute))
	defer seal.Stop()
	defer check.Stop()
	defer copyT.Stop()
	_, _ = w.SelfCheck(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-seal.C:
			_ = w.SealOnce(ctx)
		case <-check.C:
			_, _ = w.SelfCheck(ctx)
		case <-copyT.C:
			_ = w.CopyOnce(ctx)
		}
	}
}

func (w *Worker) logger() *slog.Logger {
	if w.Logger == nil {
		return slog.Default()
	}
	return w.Logger
}

func (w *Worker) clock() clock.Clock {
	if w.Clock == nil {
		return clock.Real{}
	}
	return w.Clock
}

func orDur(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}
