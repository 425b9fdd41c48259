package server

import (
	"github.com/bettercompute/bettercompute/internal/api"
	"github.com/bettercompute/bettercompute/internal/bus"
)

// wireAccess makes this process's access cache (the api's cached
// authentications and allowed read decisions) and has the modules that
// change access (iam, apikeys) drop it and poke bus.TopicAccessChanged
// after each such change commits: this process's cache is dropped before
// the call answers, and bridgePokes carries the poke to the others.
func (cp *ControlPlane) wireAccess(o Options) {
	cp.access = api.NewAccessCache(o.Clock)
	changed := func() {
		cp.access.Drop()
		cp.Bus.Publish(bus.TopicAccessChanged)
	}
	cp.IAM.OnAccessChanged(changed)
	cp.APIKeys.OnAccessChanged(changed)
}

// cacheAccess has the api serve from the access cache, dropped on every
// local or remote access poke; on PostgreSQL only while this process's
// poke listener hears its own heartbeat (pokeLiveness).
func (cp *ControlPlane) cacheAccess(srv *api.Server) {
	var live api.Liveness
	if cp.pokes != nil {
		live = cp.pokes.live
	}
	cp.runLoop(srv.CacheAccess(cp.access, cp.Bus, live))
}
