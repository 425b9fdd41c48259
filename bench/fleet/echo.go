package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// The baseline: a bare gRPC server on the same TLS 1.3 setup (mutual TLS,
// P-256) that only echoes one message over each of N streams. It measures
// the transport's own fan-out cost, with nothing of the control plane.

func selfSigned() (tls.Certificate, *x509.CertPool, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "echo"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(24 * time.Hour), DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leaf, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, pool, nil
}

type echoServer struct {
	nodev1.UnimplementedGatewayServer
	mu      sync.Mutex
	streams []nodev1.Gateway_SessionServer
	ready   chan struct{}
	n       int
	echoes  atomic.Int64
	done    chan struct{}
}

func (s *echoServer) Session(st nodev1.Gateway_SessionServer) error {
	if _, err := st.Recv(); err != nil { // Hello
		return err
	}
	s.mu.Lock()
	s.streams = append(s.streams, st)
	if len(s.streams) == s.n {
		close(s.ready)
	}
	s.mu.Unlock()
	for {
		if _, err := st.Recv(); err != nil {
			return nil
		}
		if s.echoes.Add(1) == int64(s.n) {
			close(s.done)
		}
	}
}

// writeEchoCert writes a self-signed certificate and key (0600) to dir,
// shared by the echo server and clients as their mutual-TLS identity.
func writeEchoCert(dir string) error {
	cert, _, err := selfSigned()
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "echo.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "echo.key"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
}

func loadEchoCert(dir string) (tls.Certificate, *x509.CertPool, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "echo.crt"), filepath.Join(dir, "echo.key"))
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(leaf)
	return cert, pool, nil
}

// echoServerMain is `fleet echo-server DIR ADDR N`: it waits for N
// streams, sends one message on each, and prints the time until every
// echo came back as {"echo_fanout_seconds": x}.
func echoServerMain(dir, addr string, n int) error {
	srv := &echoServer{n: n, ready: make(chan struct{}), done: make(chan struct{})}
	stop, err := serveBaseline(dir, addr, srv, srv.ready)
	if err != nil {
		return fmt.Errorf("echo: %w", err)
	}
	defer stop()
	start := time.Now()
	srv.mu.Lock()
	streams := append([]nodev1.Gateway_SessionServer(nil), srv.streams...)
	srv.mu.Unlock()
	for _, st := range streams {
		if err := st.Send(&nodev1.ServerMessage{Msg: &nodev1.ServerMessage_Ping{Ping: &nodev1.Ping{TimeMs: 1}}}); err != nil {
			return err
		}
	}
	select {
	case <-srv.done:
	case <-time.After(5 * time.Minute):
		return fmt.Errorf("echo: %d of %d echoes", srv.echoes.Load(), n)
	}
	b, _ := json.Marshal(map[string]float64{"echo_fanout_seconds": time.Since(start).Seconds()})
	fmt.Println(string(b))
	return nil
}

// serveBaseline serves srv as a gateway on addr with the baselines'
// mutual TLS (the certificate in dir) and waits, at most 15 minutes, for
// ready (every stream connected); stop stops the server.
func serveBaseline(dir, addr string, srv nodev1.GatewayServer, ready <-chan struct{}) (stop func(), err error) {
	cert, pool, err := loadEchoCert(dir)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool})))
	nodev1.RegisterGatewayServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	select {
	case <-ready:
		return gs.Stop, nil
	case <-time.After(15 * time.Minute):
		gs.Stop()
		return nil, errors.New("not every stream connected within 15 minutes")
	}
}

// echoClientsMain is `fleet echo-clients DIR ADDR N`: N streams that echo
// every message, until killed.
func echoClientsMain(dir, addr string, n int) error {
	cert, pool, err := loadEchoCert(dir)
	if err != nil {
		return err
	}
	ccfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: "localhost"}
	sem := make(chan struct{}, 64)
	for i := 0; i < n; i++ {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(ccfg)))
			if err != nil {
				return
			}
			st, err := nodev1.NewGatewayClient(conn).Session(context.Background())
			if err != nil {
				return
			}
			if err := st.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Hello{Hello: &nodev1.Hello{NodeId: "n"}}}); err != nil {
				return
			}
			go func() {
				for {
					m, err := st.Recv()
					if err != nil {
						return
					}
					_ = st.Send(&nodev1.NodeMessage{Msg: &nodev1.NodeMessage_Ping{Ping: &nodev1.Ping{TimeMs: m.GetPing().GetTimeMs()}}})
				}
			}()
		}()
	}
	select {}
}
