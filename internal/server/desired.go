package server

import (
	"context"
	"errors"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/gateway"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
	"github.com/bettercompute/bettercompute/internal/signing"
)

// desiredStates signs a node's desired state for the gateway: the host
// section of the session's certificate from the nodes module (role,
// allowed kinds, host generation, read in one statement), signed with the
// current worker key.
type desiredStates struct {
	n   *nodes.Service
	sig *signing.Signer
}

// desiredStates returns the gateway's desired-state signer, nil when this
// process holds no worker key to sign with (a gateway-only process).
func (cp *ControlPlane) desiredStates() gateway.DesiredStates {
	if cp.intentSigner == nil {
		return nil
	}
	return desiredStates{n: cp.Nodes, sig: cp.intentSigner}
}

// DesiredState signs the desired state of nodeID's certificate serial. No
// worker key yet (a fresh deployment's first seconds) is no state to send.
func (d desiredStates) DesiredState(ctx context.Context, nodeID, serial string) (*nodev1.SignedDesiredState, error) {
	h, err := d.n.HostSectionOf(ctx, serial)
	if err != nil {
		return nil, err
	}
	if h.NodeID != nodeID {
		return nil, errs.New(errs.AccessDenied, "certificate of another node")
	}
	sd, err := d.sig.SignDesiredState(ctx, &nodev1.DesiredState{NodeId: h.NodeID, Generation: h.Generation,
		Host: &nodev1.HostSection{Role: h.Role, AllowedKinds: h.AllowedKinds}})
	if errors.Is(err, signing.ErrNoWorkerKey) {
		return nil, nil
	}
	return sd, err
}
