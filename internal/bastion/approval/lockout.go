package approval

import (
	"slices"
	"time"
)

// The lockout after repeated refused writes.
const (
	// LockRefusals refused writes within LockWindow lock writes.
	LockRefusals = 5
	// LockWindow is the span LockRefusals refusals must fall in.
	LockWindow = 10 * time.Minute
	// LockFor is how long writes stay locked after the last refusal of
	// such a run.
	LockFor = 10 * time.Minute
)

// NoteRefusedWrite records a refused write at the clock's now. With the
// approvals file damaged it records nothing (writes are locked anyway).
func (s *Store) NoteRefusedWrite() {
	_ = s.withLock(func() error {
		s.noteRefusedLocked()
		return nil
	})
}

// noteRefusedLocked is NoteRefusedWrite with the lock held. It is best
// effort: a refusal that cannot be written is not recorded.
func (s *Store) noteRefusedLocked() {
	st, err := s.loadState()
	if err != nil {
		return
	}
	now := s.clock.Now()
	st.Refused = append(st.Refused, now)
	_ = s.saveState(st, now)
}

// WritesLocked reports whether writes are locked and until when:
// LockRefusals refused writes within LockWindow lock them until LockFor
// after the last of those. With the approvals file damaged it fails
// closed: locked, until LockFor from now.
func (s *Store) WritesLocked() (until time.Time, locked bool) {
	now := s.clock.Now()
	st, err := s.loadState()
	if err != nil {
		return now.Add(LockFor), true
	}
	until = lockedUntil(st.Refused)
	if now.Before(until) {
		return until, true
	}
	return time.Time{}, false
}

// lockedUntil returns the end of the latest lock the refusal times make
// (zero if none).
func lockedUntil(refused []time.Time) time.Time {
	ts := slices.Clone(refused)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	var until time.Time
	for i := LockRefusals - 1; i < len(ts); i++ {
		if ts[i].Sub(ts[i-LockRefusals+1]) <= LockWindow && ts[i].Add(LockFor).After(until) {
			until = ts[i].Add(LockFor)
		}
	}
	return until
}

// maxRefusals is how many refusal times are kept. Kept times all fall in
// LockWindow+LockFor, so 64 of them always hold a window of LockRefusals
// later than any dropped one, and dropping older ones never shortens a
// lock.
const maxRefusals = 64

// recentRefusals keeps the latest maxRefusals refusal times that can still
// take part in a lock at now or later.
func recentRefusals(refused []time.Time, now time.Time) []time.Time {
	var out []time.Time
	for _, t := range refused {
		if t.After(now.Add(-(LockWindow + LockFor))) {
			out = append(out, t)
		}
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	if len(out) > maxRefusals {
		out = out[len(out)-maxRefusals:]
	}
	return out
}
