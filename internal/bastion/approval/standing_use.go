package approval

import (
	"fmt"
	"time"
)

// GrantStanding verifies code (as VerifyCode), then adds a standing grant
// for op kind in [notBefore, notAfter) at perHour and perDay runs. The
// window must end in the future and be at most MaxWindow long
// (ReasonBadWindow); both rates must be 1..MaxPerDay (ReasonBadRate).
func (s *Store) GrantStanding(kind string, notBefore, notAfter time.Time, perHour, perDay int, code string) (Standing, error) {
	var g Standing
	err := s.withLock(func() error {
		if err := s.verifyLocked(code); err != nil {
			return err
		}
		now := s.clock.Now()
		switch {
		case !validOp(kind):
			return refuse(ReasonBadKind, "an op kind is 1 to 64 characters of a-z, 0-9, ':', '.', '_', '-'")
		case !notAfter.After(notBefore) || notAfter.Sub(notBefore) > MaxWindow || !notAfter.After(now):
			return refuse(ReasonBadWindow, "the window must end after it begins, in the future, at most 30 days long")
		case perHour < 1 || perDay < 1 || perHour > MaxPerDay || perDay > MaxPerDay:
			return refuse(ReasonBadRate, fmt.Sprintf("rates must be 1 to %d", MaxPerDay))
		}
		d, err := s.loadOps()
		if err != nil {
			return err
		}
		if len(d.Records) >= MaxStanding {
			return refuse(ReasonTooManyGrants, fmt.Sprintf("ops.json holds %d grants already", len(d.Records)))
		}
		id, err := newID("sg_")
		if err != nil {
			return err
		}
		g = Standing{ID: id, Kind: kind, NotBefore: notBefore, NotAfter: notAfter, PerHour: perHour, PerDay: perDay, Valid: true}
		rec, err := s.sealRecord(g)
		if err != nil {
			return err
		}
		d.Records = append(d.Records, rec)
		return s.saveOps(d)
	})
	if err != nil {
		return Standing{}, err
	}
	return g, nil
}

// UseStanding takes one run of a valid standing grant for kind whose
// window holds now and which has fewer than PerHour runs in the last hour
// and PerDay in the last day: it logs now in the record, reseals it and
// returns it. Runs older than a day are pruned. Without such a grant it
// refuses ReasonNoStanding, or with the reason of the first grant for kind
// in file order: ReasonOutsideWindow, ReasonRateHour or ReasonRateDay.
func (s *Store) UseStanding(kind string) (Standing, error) {
	var used Standing
	err := s.withLock(func() error {
		d, err := s.loadOps()
		if err != nil {
			return refuse(ReasonNoStanding, "ops.json does not parse, so it holds no grant")
		}
		now := s.clock.Now()
		var first error
		for i, g := range openRecords(opsKey(s.secret), s.bastion, d) {
			if !g.Valid || g.Kind != kind {
				continue
			}
			g.Runs = runsSince(g.Runs, now.Add(-24*time.Hour))
			if err := allows(g, now); err != nil {
				if first == nil {
					first = err
				}
				continue
			}
			g.Runs = append(g.Runs, now)
			if d.Records[i], err = s.sealRecord(g); err != nil {
				return err
			}
			used = g
			return s.saveOps(d)
		}
		if first == nil {
			first = refuse(ReasonNoStanding, "no standing grant for that op kind here")
		}
		return first
	})
	if err != nil {
		return Standing{}, err
	}
	return used, nil
}

// allows returns nil if g's window holds now and its rates leave a run.
func allows(g Standing, now time.Time) error {
	switch {
	case now.Before(g.NotBefore) || !now.Before(g.NotAfter):
		return refuse(ReasonOutsideWindow, "the standing grant's window does not hold now")
	case len(runsSince(g.Runs, now.Add(-time.Hour))) >= g.PerHour:
		return refuse(ReasonRateHour, fmt.Sprintf("the standing grant allows %d runs an hour", g.PerHour))
	case len(g.Runs) >= g.PerDay:
		return refuse(ReasonRateDay, fmt.Sprintf("the standing grant allows %d runs a day", g.PerDay))
	}
	return nil
}

// runsSince returns the runs after t.
func runsSince(runs []time.Time, t time.Time) []time.Time {
	var out []time.Time
	for _, r := range runs {
		if r.After(t) {
			out = append(out, r)
		}
	}
	return out
}
