package server

import (
	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/errs"
)

// startAudit starts the workers role's audit job: sealing every
// AuditSealInterval (default 1h), the 3-hour unsealed-rows self-check
// (log and metric on cp.Metrics), and, with AuditSink, copying sealed rows
// to the sink. It runs in the roles' group and stops with the control
// plane.
func (cp *ControlPlane) startAudit(o Options) error {
	priv, err := o.Bundle.AuditSigningKey(o.KEK)
	if err != nil {
		return errs.Wrap(errs.InvalidConfig, "the audit key does not unseal with this key-encryption key", err)
	}
	key, err := auditlog.NewSigningKey(o.Bundle.Deployment, priv)
	if err != nil {
		return errs.Wrap(errs.InvalidConfig, "the audit key cannot sign", err)
	}
	// The last checkpoint may be signed by a key the audit key replaced.
	if key.Verifier, err = auditlog.NewKeyRing(o.Bundle.Deployment, o.Bundle.AuditKeys()); err != nil {
		return errs.Wrap(errs.InvalidConfig, "the audit keys cannot verify", err)
	}
	l, err := auditlog.New(auditlog.Config{DB: o.DB, Deployment: o.Bundle.Deployment, Clock: o.Clock, Log: o.Log})
	if err != nil {
		return err
	}
	m, err := auditlog.NewMetrics(cp.Metrics)
	if err != nil {
		return err
	}
	w := &auditlog.Worker{Log: l, Key: key, Metrics: m, Logger: o.Log, Clock: o.Clock, SealInterval: o.AuditSealInterval}
	if o.AuditSink != nil {
		w.Pump = auditlog.NewPump(o.DB, o.AuditSink, o.AuditSinkName, o.Clock, o.Log)
	}
	cp.Audit = w
	cp.runLoop(w.Run)
	return nil
}
