// Package bus is the in-process poke bus: a mutation publishes a topic and
// whoever waits on it (the signing worker, the gateway holding a node's
// session) wakes up and reads the database. A poke carries no data, so a
// lost or coalesced poke costs only latency; periodic sweeps catch up.
package bus

import "sync"

// Bus fans pokes out to subscribers of a topic. The zero value is not
// usable; call New.
type Bus struct {
	mu   sync.Mutex
	subs map[string]map[chan struct{}]struct{}
}

// New returns an empty bus.
func New() *Bus { return &Bus{subs: map[string]map[chan struct{}]struct{}{}} }

// Subscribe returns a channel that receives a value (coalesced) after each
// Publish of topic, and a function that ends the subscription.
func (b *Bus) Subscribe(topic string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	b.mu.Lock()
	if b.subs[topic] == nil {
		b.subs[topic] = map[chan struct{}]struct{}{}
	}
	b.subs[topic][ch] = struct{}{}
	b.mu.Unlock()
	return ch, func() {
		b.mu.Lock()
		delete(b.subs[topic], ch)
		if len(b.subs[topic]) == 0 {
			delete(b.subs, topic)
		}
		b.mu.Unlock()
	}
}

// Publish pokes every subscriber of topic without blocking.
func (b *Bus) Publish(topic string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for ch := range b.subs[topic] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Topics used across the control plane.
const (
	// TopicSign wakes the signing worker.
	TopicSign = "commands.sign"
	// TopicRevoked wakes every gateway's revocation check.
	TopicRevoked = "certs.revoked"
	// TopicApprovers wakes every gateway to send a changed approver set
	// to its connected nodes.
	TopicApprovers = "approvers.changed"
	// TopicSigned is poked once per batch of newly signed commands.
	TopicSigned = "commands.signed"
	// TopicRevocationsSigned is poked when workers signed entries of the
	// revocation feed, so the gateways relay them to nodes at once.
	TopicRevocationsSigned = "revocations.signed"
	// TopicSessions is poked when a node's session moved to another
	// gateway, so the gateway that held it closes its copy at once.
	TopicSessions = "sessions.moved"
	// TopicBastions is poked when a bastion's grants change or it is
	// unpaired, so the gateway resends grants (or closes the bastion's
	// session) and the lanes role drops an unpaired bastion's peer at once.
	TopicBastions = "bastions.changed"
	// TopicAccessChanged is poked after any change that can narrow what a
	// caller may do (a credential revoked, a binding, key or delegation
	// changed, a tenant suspended), so every process drops what it cached
	// about authentication and decisions at once.
	TopicAccessChanged = "access.changed"
)

// RemoteTopic is the topic under which a poke from another process (over
// PostgreSQL NOTIFY) is republished here; it is never forwarded again.
func RemoteTopic(topic string) string { return "remote." + topic }

// NodeTopic is the topic poked when a node has something to receive.
func NodeTopic(nodeID string) string { return "node." + nodeID }

// CommandTopic is poked when a command's state changes.
func CommandTopic(id string) string { return "command." + id }
