package apikeys

// OnAccessChanged sets f, called after each committed revocation of a key
// or session (by its id, or a tenant's teardown). The server publishes
// bus.TopicAccessChanged with it, so every process drops its cached
// authentications and decisions at once. Set it before serving.
func (s *Service) OnAccessChanged(f func()) { s.onAccessChanged = f }

// accessChanged calls the OnAccessChanged hook, if any.
func (s *Service) accessChanged() {
	if s.onAccessChanged != nil {
		s.onAccessChanged()
	}
}
