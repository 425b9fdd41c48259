package approval

import (
	"slices"
	"time"
)

// Pending returns the requests that are neither expired nor spent, oldest
// first (approved ones included: they wait to be spent).
func (s *Store) Pending() ([]Request, error) {
	st, err := s.loadState()
	if err != nil {
		return nil, err
	}
	now := s.clock.Now()
	var out []Request
	for _, r := range st.Requests {
		if !r.Spent && now.Before(r.Expires) {
			out = append(out, r.Request)
		}
	}
	return out, nil
}

// Get returns the request id. One not kept is ReasonUnknownRequest, a
// spent one ReasonApprovalSpent, an expired one ReasonApprovalExpired.
func (s *Store) Get(id string) (Request, error) {
	st, err := s.loadState()
	if err != nil {
		return Request{}, err
	}
	i, err := usable(&st, id, s.clock.Now())
	if err != nil {
		return Request{}, err
	}
	return st.Requests[i].Request, nil
}

// usable returns the index of request id if it is kept, unspent and
// unexpired at now, else the refusal.
func usable(st *approvalState, id string, now time.Time) (int, error) {
	i := slices.IndexFunc(st.Requests, func(r storedRequest) bool { return r.ID == id })
	switch {
	case i < 0:
		return -1, refuse(ReasonUnknownRequest, "no such approval request here")
	case st.Requests[i].Spent:
		return -1, refuse(ReasonApprovalSpent, "the approval was already used")
	case !now.Before(st.Requests[i].Expires):
		return -1, refuse(ReasonApprovalExpired, "the request expired; ask again")
	}
	return i, nil
}

// Approve verifies code (VerifyCode, so a refused code counts as a refused
// write) and then marks request id approved if it is kept, unspent and
// unexpired.
func (s *Store) Approve(id, code string) error {
	return s.withLock(func() error {
		if err := s.verifyLocked(code); err != nil {
			return err
		}
		st, err := s.loadState()
		if err != nil {
			return err
		}
		now := s.clock.Now()
		i, err := usable(&st, id, now)
		if err != nil {
			return err
		}
		st.Requests[i].Approved = true
		return s.saveState(st, now)
	})
}

// Deny drops request id (unspent and unexpired), so it can never be
// approved or spent; a later Spend of it is ReasonUnknownRequest.
func (s *Store) Deny(id string) error {
	return s.updateState(func(st *approvalState, now time.Time) error {
		i, err := usable(st, id, now)
		if err != nil {
			return err
		}
		st.Requests = slices.Delete(st.Requests, i, i+1)
		return nil
	})
}

// Spend uses the approval of request id for op and digest, once. Refusals,
// in order: ReasonUnknownRequest, ReasonApprovalMismatch (another op or
// digest), ReasonNotApproved, ReasonApprovalExpired, ReasonApprovalSpent.
// A spent request is kept until after it expires, so a replay is refused
// as spent. Spend does not count its refusals; the caller calls
// NoteRefusedWrite for a refused write.
func (s *Store) Spend(id, op, digest string) error {
	return s.updateState(func(st *approvalState, now time.Time) error {
		i := slices.IndexFunc(st.Requests, func(r storedRequest) bool { return r.ID == id })
		if i < 0 {
			return refuse(ReasonUnknownRequest, "no such approval request here")
		}
		r := &st.Requests[i]
		switch {
		case r.Op != op || r.Digest != digest:
			return refuse(ReasonApprovalMismatch, "the approval is for another op or other arguments")
		case !r.Approved:
			return refuse(ReasonNotApproved, "the request was not approved on the machine; run `bcd bastion approve "+id+"`")
		case !now.Before(r.Expires):
			return refuse(ReasonApprovalExpired, "the approval expired; ask again")
		case r.Spent:
			return refuse(ReasonApprovalSpent, "the approval was already used")
		}
		r.Spent = true
		return nil
	})
}
