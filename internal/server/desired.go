package server

import (
	"context"
	"errors"

	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/gateway"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/proto/internalv1"
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

// DesiredState signs a node's desired state for a gateway-only process
// (internalv1.GatewayServices.DesiredState): the same answer the api's own
// gateway sends, empty when there is none yet.
func (c *controlServer) DesiredState(ctx context.Context, req *internalv1.DesiredStateRequest) (*internalv1.DesiredStateResponse, error) {
	if c.desired == nil {
		return &internalv1.DesiredStateResponse{}, nil
	}
	sd, err := c.desired.DesiredState(ctx, req.GetNodeId(), req.GetSerial())
	if err != nil {
		if errs.CodeOf(err) == errs.Internal {
			c.log.Error("relayed desired state failed", "node_id", req.GetNodeId(), "err", err)
		}
		return nil, statusOf(err)
	}
	if sd == nil {
		return &internalv1.DesiredStateResponse{}, nil
	}
	raw, err := proto.Marshal(sd)
	if err != nil {
		return nil, statusOf(err)
	}
	return &internalv1.DesiredStateResponse{SignedDesiredState: raw}, nil
}

// relayedDesiredStates asks the api's internal channel for a node's
// signed desired state: a gateway-only process holds no key to sign it.
type relayedDesiredStates struct {
	client internalv1.GatewayServicesClient
}

// DesiredState relays to the api; an empty answer is nothing to send.
func (r relayedDesiredStates) DesiredState(ctx context.Context, nodeID, serial string) (*nodev1.SignedDesiredState, error) {
	resp, err := r.client.DesiredState(ctx, &internalv1.DesiredStateRequest{NodeId: nodeID, Serial: serial})
	if err != nil {
		return nil, errorOf(err)
	}
	if len(resp.GetSignedDesiredState()) == 0 {
		return nil, nil
	}
	var sd nodev1.SignedDesiredState
	if err := proto.Unmarshal(resp.GetSignedDesiredState(), &sd); err != nil {
		return nil, errs.Wrap(errs.Internal, "decode relayed desired state", err)
	}
	return &sd, nil
}
