package forward

import "sync"

// DefaultStreams is how many live streams one pairing holds in production.
const DefaultStreams = 16

// Streams caps the live streams of one pairing. One Streams is shared by
// every forward and service slot of that pairing, so the cap is the
// pairing's, not a listener's. It is safe for concurrent use.
type Streams struct {
	mu   sync.Mutex
	live int
	max  int
}

// NewStreams returns a cap of max live streams (DefaultStreams in
// production). A max below 1 admits nothing.
func NewStreams(max int) *Streams { return &Streams{max: max} }

// Acquire takes a slot without waiting. ok is false when every slot is in
// use; otherwise release gives the slot back (calling it again is a no-op).
func (s *Streams) Acquire() (release func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.live >= s.max {
		return nil, false
	}
	s.live++
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.live--
			s.mu.Unlock()
		})
	}, true
}

// Live returns how many slots are held.
func (s *Streams) Live() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live
}
