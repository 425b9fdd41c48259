package iam

// OnAccessChanged sets f, called after each committed change of this
// module that can narrow what a caller may do: a tenant's state set
// (suspended, resumed or deleted), an identity deleted, a binding made
// (a role may deny) or removed, a role deleted, an identity suspended or
// resumed, a delegation made or revoked, the held-back kinds set, a
// held-back request approved or denied. The server publishes
// bus.TopicAccessChanged with it, so every process drops its cached
// authentications and decisions at once. Set it before serving.
func (s *Service) OnAccessChanged(f func()) { s.onAccessChanged = f }

// accessChanged calls the OnAccessChanged hook, if any.
func (s *Service) accessChanged() {
	if s.onAccessChanged != nil {
		s.onAccessChanged()
	}
}
