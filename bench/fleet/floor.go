package main

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/daemon"
	"github.com/bettercompute/bettercompute/internal/ids"
	"github.com/bettercompute/bettercompute/internal/kinds"
	"github.com/bettercompute/bettercompute/internal/pki"
	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// The cryptographic floor: the second baseline, beside the bare echo. Over
// the same mutual-TLS gRPC streams (TLS 1.3, P-256, the echo's identity),
// the server sends each of N streams one diag.run command signed exactly
// as the signing worker signs one (Ed25519 by a worker key whose
// certificate the deployment's command root issued, over
// wire.CommandSigContext || the deterministic CommandBody encoding); each
// client checks it with bcd's own daemon.Verifier.Check (worker chain
// through a shared pki.WorkerChainCache as the simulated fleet shares one,
// signature, id, node, freshness, replay, kind), then answers with an
// update signed as bcd signs one (wire.SignNode with its P-256 TLS key),
// and the server checks it as the commands module attests one
// (wire.VerifyNode with the key of the node's certificate, then the body
// names the command, node, kind and payload digest it was sent). No
// database, no journal, no fsync: the work a secure design cannot skip.

// floorDiagPayload is the payload of the floor's diag.run commands.
var floorDiagPayload = []byte(`{}`)

// floorSession is one node's stream on the floor server: who it is (from
// its Hello and its TLS certificate) and what it was sent.
type floorSession struct {
	st      nodev1.Gateway_SessionServer
	nodeID  string
	pub     crypto.PublicKey
	cmdID   string
	payload [32]byte
}

// floorServer collects N streams, then counts answers that attest.
type floorServer struct {
	nodev1.UnimplementedGatewayServer
	mu       sync.Mutex
	sessions []*floorSession
	ready    chan struct{}
	n        int
	answered atomic.Int64
	refused  atomic.Int64
	total    atomic.Int64
	done     chan struct{}
}

// peerKey returns the public key of the client certificate of the stream's
// TLS session: the node key the gateway checks its updates with.
func peerKey(ctx context.Context) (crypto.PublicKey, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, errors.New("floor: no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return nil, errors.New("floor: no client certificate")
	}
	return ti.State.PeerCertificates[0].PublicKey, nil
}

// Session registers the stream once its Hello names the node, then checks
// every update it sends.
func (s *floorServer) Session(st nodev1.Gateway_SessionServer) error {
	hello, err := st.Recv()
	if err != nil {
		return err
	}
	pub, err := peerKey(st.Context())
	if err != nil {
		return err
	}
	fs := &floorSession{st: st, nodeID: hello.GetHello().GetNodeId(), pub: pub}
	s.mu.Lock()
	s.sessions = append(s.sessions, fs)
	if len(s.sessions) == s.n {
		close(s.ready)
	}
	s.mu.Unlock()
	for {
		m, err := st.Recv()
		if err != nil {
			return nil
		}
		if attestFloor(fs, m.GetUpdate()) {
			s.answered.Add(1)
		} else {
			s.refused.Add(1)
		}
		if s.total.Add(1) == int64(s.n) {
			close(s.done)
		}
	}
}

// attestFloor checks an update as the commands module does: the node's
// signature under wire.UpdateSigContext with its certificate's key, then
// that the signed body reports success on the command, node, kind and
// payload digest it was sent.
func attestFloor(fs *floorSession, upd *nodev1.CommandUpdate) bool {
	if upd == nil || !wire.VerifyNode(fs.pub, wire.UpdateSigContext, upd.GetBody(), upd.GetNodeSig()) {
		return false
	}
	var body nodev1.UpdateBody
	if err := proto.Unmarshal(upd.GetBody(), &body); err != nil {
		return false
	}
	return body.CommandId == fs.cmdID && body.NodeId == fs.nodeID && body.Kind == kinds.DiagRun &&
		string(body.PayloadSha256) == string(fs.payload[:]) && body.State == string(wire.StateSucceeded)
}

// floorWorker is a worker key certified by the deployment's command root,
// as the signing worker makes one (signing.KeyLifetime is 24 h).
type floorWorker struct {
	key  ed25519.PrivateKey
	cert []byte
}

// newFloorWorker makes and certifies a worker key with the command root
// of the bundle in pkiDir, unsealed with the KEK in kekFile.
func newFloorWorker(pkiDir, kekFile string) (floorWorker, error) {
	b, err := pki.Load(pkiDir)
	if err != nil {
		return floorWorker{}, fmt.Errorf("floor: %w", err)
	}
	kek, err := pki.LoadKEKFile(kekFile)
	if err != nil {
		return floorWorker{}, fmt.Errorf("floor: %w", err)
	}
	rootKey, err := b.CommandRootKey(kek)
	if err != nil {
		return floorWorker{}, fmt.Errorf("floor: %w", err)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return floorWorker{}, fmt.Errorf("floor: %w", err)
	}
	cert, err := pki.IssueWorkerCert(b.CommandRoots()[0], rootKey, b.TrustDomain, ids.New("wk"), pub, 24*time.Hour, time.Now())
	if err != nil {
		return floorWorker{}, fmt.Errorf("floor: %w", err)
	}
	return floorWorker{key: priv, cert: cert}, nil
}

// signCommand signs a diag.run for fs as the signing worker does
// (signing.commandBody and signing.signAll: deterministic encoding, a
// fresh 12-byte nonce, Ed25519 over wire.CommandSigContext || body).
func (w floorWorker) signCommand(fs *floorSession, now time.Time) (*nodev1.SignedCommand, error) {
	fs.cmdID = ids.New("cmd")
	fs.payload = sha256.Sum256(floorDiagPayload)
	b := &nodev1.CommandBody{CommandId: fs.cmdID, NodeId: fs.nodeID, Kind: kinds.DiagRun, Payload: floorDiagPayload,
		ExpiresAtMs: now.Add(time.Hour).UnixMilli(), IssuedAtMs: now.UnixMilli(), Nonce: ids.Secret(12)}
	body, err := proto.MarshalOptions{Deterministic: true}.Marshal(b)
	if err != nil {
		return nil, fmt.Errorf("floor: encode body: %w", err)
	}
	return &nodev1.SignedCommand{Id: fs.cmdID, Body: body, SignerCertDer: w.cert,
		Signature: ed25519.Sign(w.key, append([]byte(wire.CommandSigContext), body...))}, nil
}

// floorServerMain is `fleet floor-server DIR ADDR N`: with the echo's TLS
// identity and the bundle in DIR/pki (KEK in DIR/kek), it waits for N
// streams, then signs and sends one command on each (spread over the CPUs,
// as the worker signs) and prints the time from the first signature to the
// last attested answer as {"floor_fanout_seconds": x}.
func floorServerMain(dir, addr string, n int) error {
	w, err := newFloorWorker(filepath.Join(dir, "pki"), filepath.Join(dir, "kek"))
	if err != nil {
		return err
	}
	srv := &floorServer{n: n, ready: make(chan struct{}), done: make(chan struct{})}
	stop, err := serveBaseline(dir, addr, srv, srv.ready)
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	defer stop()
	srv.mu.Lock()
	sessions := append([]*floorSession(nil), srv.sessions...)
	srv.mu.Unlock()
	start := time.Now()
	var g errgroup.Group
	g.SetLimit(runtime.GOMAXPROCS(0))
	for _, fs := range sessions {
		g.Go(func() error {
			sc, err := w.signCommand(fs, time.Now())
			if err != nil {
				return err
			}
			return fs.st.Send(&nodev1.ServerMessage{Msg: &nodev1.ServerMessage_Command{Command: sc}})
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	select {
	case <-srv.done:
	case <-time.After(5 * time.Minute):
		return fmt.Errorf("floor: %d of %d answers", srv.total.Load(), n)
	}
	elapsed := time.Since(start)
	if r := srv.refused.Load(); r > 0 {
		return fmt.Errorf("floor: %d of %d answers did not attest", r, n)
	}
	b, _ := json.Marshal(map[string]float64{"floor_fanout_seconds": elapsed.Seconds()})
	fmt.Println(string(b))
	return nil
}

// floorNode is one simulated node of the floor: its verifier (bcd's) and
// the ids it has seen (bcd's replay check).
type floorNode struct {
	v    *daemon.Verifier
	key  crypto.Signer
	seen map[string]bool
}

// answer checks sc as bcd does and returns the update bcd would send: a
// success signed with the node key, or a refusal with bcd's reason.
func (fn *floorNode) answer(sc *nodev1.SignedCommand) (*nodev1.CommandUpdate, error) {
	now := time.Now()
	body, reason := fn.v.Check(sc, now, nil, func(id string) bool { return fn.seen[id] })
	ub := &nodev1.UpdateBody{CommandId: sc.GetId(), NodeId: fn.v.NodeID, State: string(wire.StateSucceeded), TimeMs: now.UnixMilli()}
	if reason != "" {
		ub.State, ub.Reason = string(wire.StateCancelled), reason
	}
	if body != nil {
		fn.seen[body.CommandId] = true
		sum := sha256.Sum256(body.Payload)
		ub.Kind, ub.PayloadSha256 = body.Kind, sum[:]
	}
	enc, err := proto.MarshalOptions{Deterministic: true}.Marshal(ub)
	if err != nil {
		return nil, fmt.Errorf("floor: encode update: %w", err)
	}
	sig, err := wire.SignNode(fn.key, wire.UpdateSigContext, enc)
	if err != nil {
		return nil, err
	}
	return &nodev1.CommandUpdate{Body: enc, NodeSig: sig, CertSerial: "floor"}, nil
}

// floorClientsMain is `fleet floor-clients DIR ADDR N`: N streams, each a
// node that checks every command as bcd does and answers it signed, until
// killed.
func floorClientsMain(dir, addr string, n int) error {
	cert, pool, err := loadEchoCert(dir)
	if err != nil {
		return err
	}
	b, err := pki.LoadPublic(filepath.Join(dir, "pki"))
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	key, ok := cert.PrivateKey.(crypto.Signer)
	if !ok {
		return errors.New("floor: node key is not a signer")
	}
	roots, chains := b.CommandRoots(), pki.NewWorkerChainCache(0)
	ccfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "localhost"}
	sem := make(chan struct{}, 64)
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		fn := &floorNode{key: key, seen: map[string]bool{}, v: &daemon.Verifier{NodeID: fmt.Sprintf("floor-%d", i), Role: pki.RoleNode,
			TrustDomain: b.TrustDomain, CommandRoots: roots, WorkerChains: chains}}
		go func() {
			defer func() { <-sem }()
			floorClient(addr, ccfg, fn)
		}()
	}
	select {}
}

// floorClient opens fn's stream, says Hello with its node id and answers
// every command on a goroutine of its own.
func floorClient(addr string, ccfg *tls.Config, fn *floorNode) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(ccfg)))
	if err != nil {
		return
	}
	st, err := nodev1.NewGatewayClient(conn).Session(context.Background())
	if err != nil {
		return
	}
	if err := st.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: &nodev1.Hello{NodeId: fn.v.NodeID}}}); err != nil {
		return
	}
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				return
			}
			upd, err := fn.answer(m.GetCommand())
			if err != nil {
				return
			}
			_ = st.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Update{Update: upd}})
		}
	}()
}
