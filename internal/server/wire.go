package server

import (
	"crypto/x509"
	"fmt"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// image stores
	_ "gocloud.dev/blob/memblob"  // mem:// image stores

	"github.com/bettercompute/bettercompute/internal/apikeys"
	"github.com/bettercompute/bettercompute/internal/audit"
	"github.com/bettercompute/bettercompute/internal/bastions"
	"github.com/bettercompute/bettercompute/internal/breakglass"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/quorum"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/previews"
	"github.com/bettercompute/bettercompute/internal/secrets"
	"github.com/bettercompute/bettercompute/internal/signing"
	"github.com/bettercompute/bettercompute/internal/tickets"
	"github.com/bettercompute/bettercompute/internal/tunnels"
)

// buildModules is the one place the modules are made: each from its
// constructor, in dependency order, so that what a module needs exists
// before it (the commands table's Store before the secrets broker and the
// signer, which read it, and the commands module, which checks references
// with the broker).
func (cp *ControlPlane) buildModules(o Options, r roles, k keys) error {
	b := o.Bundle
	cp.Events = audit.NewEvents(o.DB, o.Clock, iam.RootTenant)
	cp.Quotas = quota.New(o.DB, o.Clock, o.Quotas)
	cp.Nodes = nodes.New(o.DB, o.Clock, cp.Events, cp.Bus, o.Log, cp.Quotas, nodes.Config{TrustDomain: b.TrustDomain, NodeCA: b.NodeCA,
		CertLifetime: o.NodeCertLifetime, RenewInterval: o.RenewInterval, JoinPublicKey: b.JoinKey, JoinPin: pki.JoinKeyPin(b.JoinKey),
		AcceptedPins: joinPins(b), NodeCAKey: k.nodeCA, BundleBody: k.bundleBody, BundleSig: k.bundleSig, OtherSignatures: k.bundleOthers})
	tb := b.TrustBundle(o.Clock.Now())
	var err error
	if cp.Quorum, err = quorum.New(o.DB, o.Clock, cp.Bus, cp.Nodes, b.Deployment, tb.Approvers, b.Threshold, o.Log); err != nil {
		return err
	}
	cp.IAM = iam.New(o.DB, o.Clock)
	cp.Bastions = bastions.New(o.DB, o.Clock, o.KEK, cp.Nodes, cp.Bus, o.Log)
	cp.APIKeys = apikeys.New(o.DB, o.Clock, cp.IAM)
	commandStore := commands.NewStore(o.DB)
	if r.api {
		cp.Secrets = secrets.New(o.DB, o.Clock, o.KEK, cp.IAM, cp.Nodes, liveCommands{st: commandStore}, cp.Events, o.Log)
	}
	cp.Commands = commands.New(commands.Deps{Store: commandStore, Clock: o.Clock, Bus: cp.Bus, Nodes: cp.Nodes, Batches: cp.Quorum,
		Quotas: cp.Quotas, Secrets: secretRefs{s: cp.Secrets}, Log: o.Log})
	bucket, err := cp.openImages(o)
	if err != nil {
		return err
	}
	cp.Sandboxes = sandboxes.New(o.DB, o.Clock, cp.Bus, cp.Commands, cp.Nodes, cp.Quotas, bucket, o.Log)
	cp.Sandboxes.SetMaxImageBytes(o.SandboxMaxImageBytes)
	cp.Sandboxes.SetOwners(cp.IAM)
	cp.Sandboxes.SetSecretEnv(o.KEK, tenantSecrets{s: cp.Secrets})
	if r.api {
		if cp.BreakGlass, err = breakglass.New(o.DB, o.Clock, cp.Commands, cp.Nodes, k.breakGlass, o.Log); err != nil {
			return err
		}
	}
	if r.workers {
		cp.Signer = signing.New(signing.Deps{DB: o.DB, Commands: commandStore, Clock: o.Clock, KEK: o.KEK, Root: b.CommandRoot, RootKey: k.commandRoot,
			TrustDomain: b.TrustDomain, Bus: cp.Bus, Batches: cp.Quorum, Log: o.Log})
	}
	if cp.ticketVerifier, err = ticketVerifier(o); err != nil {
		return err
	}
	if r.api {
		ticketSigner := cp.Signer
		if ticketSigner == nil {
			ticketSigner = signing.NewTicketSigner(o.DB, o.Clock, o.KEK, b.CommandRoot, b.TrustDomain, o.Log)
		}
		cp.Tunnels = tunnels.New(tunnels.Deps{DB: o.DB, Clock: o.Clock, Signer: ticketSigner, Verifier: cp.ticketVerifier, Log: o.Log})
		cp.intentSigner = ticketSigner
		if cp.Sandboxes != nil {
			cp.Previews = previews.New(o.DB, previews.NewKeys(o.DB, o.KEK, o.Clock), cp.Sandboxes, o.Clock, cp.previewBase(o))
		}
	} else {
		cp.intentSigner = cp.Signer
	}
	cp.wireRevocations(o)
	return nil
}

// ticketVerifier checks tunnel tickets against the command-signing roots
// of the trust bundle (the api before it asks the gateway, the gateway
// before it asks the node).
func ticketVerifier(o Options) (*tickets.Verifier, error) {
	roots, err := o.Bundle.TrustBundle(o.Clock.Now()).CommandRootCerts()
	if err != nil {
		return nil, fmt.Errorf("server: command roots: %w", err)
	}
	return &tickets.Verifier{Roots: func() []*x509.Certificate { return roots }, TrustDomain: o.Bundle.TrustDomain,
		WorkerChains: pki.NewWorkerChainCache(0)}, nil
}

// openImages opens the sandbox image store when one is configured (nil
// when not); Close closes it after the roles stop.
func (cp *ControlPlane) openImages(o Options) (*blob.Bucket, error) {
	if o.SandboxImages == "" {
		return nil, nil
	}
	b, err := blob.OpenBucket(cp.ctx, o.SandboxImages)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidConfig, "the sandbox image store does not open", fmt.Errorf("server: %w", err))
	}
	cp.closers = append(cp.closers, func() { _ = b.Close() })
	return b, nil
}

// joinPins are the pins of every join key b holds: a join token pinning
// any of them is accepted while the join key rotates.
func joinPins(b *pki.Bundle) [][32]byte {
	var out [][32]byte
	for _, k := range b.JoinKeys() {
		out = append(out, pki.JoinKeyPin(k))
	}
	return out
}
