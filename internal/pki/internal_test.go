package pki

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The gateway's files hold no private key of the bundle, sealed or not:
// the public half loads, nothing in it unseals, and the full Load refuses
// it. The gateway key is 0600 and LoadGatewayCert refuses a looser one.
func TestGatewayFilesHoldNoBundleKey(t *testing.T) {
	b, kek, _ := newBundle(t)
	caKey, err := b.InternalCAKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := IssueGatewayCert(b.InternalCA, caKey, td, []string{"gw.example"}, []net.IP{net.IPv4(10, 0, 0, 1)}, 24*time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "gw")
	if err := b.WriteGatewayFiles(dir, cert); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, BundleFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range keyNames {
		if bytes.Contains(raw, []byte(`"`+name+`"`)) {
			t.Fatalf("the gateway's bundle.json names the sealed key %s", name)
		}
	}
	if _, err := Load(dir); err == nil {
		t.Fatal("Load accepted a bundle without sealed keys")
	}
	pub, err := LoadPublic(dir)
	if err != nil {
		t.Fatalf("LoadPublic: %v", err)
	}
	if !pub.Public() || pub.NodeCA == nil || !pub.InternalCA.Equal(b.InternalCA) {
		t.Fatalf("public half: public=%v", pub.Public())
	}
	if _, err := pub.NodeCAKey(kek); err == nil {
		t.Fatal("a node CA key unsealed from the public half")
	}
	keyFile := filepath.Join(dir, GatewayKeyFile)
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("gateway.key: %v %v", fi, err)
	}
	if _, err := LoadGatewayCert(filepath.Join(dir, GatewayCertFile), keyFile); err != nil {
		t.Fatalf("LoadGatewayCert: %v", err)
	}
	if err := os.Chmod(keyFile, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadGatewayCert(filepath.Join(dir, GatewayCertFile), keyFile); err == nil {
		t.Fatal("LoadGatewayCert accepted a key readable by others")
	}
}

// LoadPublic of a full bundle directory drops the sealed keys from memory.
func TestLoadPublicDropsSealedKeys(t *testing.T) {
	_, kek, dir := newBundle(t)
	pub, err := LoadPublic(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !pub.Public() {
		t.Fatal("sealed keys kept")
	}
	if _, err := pub.InternalCAKey(kek); err == nil {
		t.Fatal("the internal CA key unsealed from LoadPublic")
	}
}

// internalPeers returns a bundle and a gateway and a control certificate
// issued by its internal CA at t0 for an hour.
func internalPeers(t *testing.T) (*Bundle, tls.Certificate, tls.Certificate) {
	t.Helper()
	b, kek, _ := newBundle(t)
	caKey, err := b.InternalCAKey(kek)
	if err != nil {
		t.Fatal(err)
	}
	gw, err := IssueGatewayCert(b.InternalCA, caKey, td, nil, nil, time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := IssueControlCert(b.InternalCA, caKey, td, nil, nil, time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	return b, gw, ctl
}

// A peer on the internal channel is accepted only with the expected SPIFFE
// ID, under the internal CA, for the expected usage.
func TestVerifyInternalPeer(t *testing.T) {
	b, gw, ctl := internalPeers(t)
	now := t0.Add(time.Minute)
	if err := VerifyInternalPeer(gw.Certificate, b.InternalRoots(), GatewaySPIFFEID(td), x509.ExtKeyUsageClientAuth, now); err != nil {
		t.Fatalf("gateway as client: %v", err)
	}
	if err := VerifyInternalPeer(ctl.Certificate, b.InternalRoots(), ControlSPIFFEID(td), x509.ExtKeyUsageServerAuth, now); err != nil {
		t.Fatalf("control as server: %v", err)
	}
	if err := VerifyInternalPeer(gw.Certificate, b.InternalRoots(), ControlSPIFFEID(td), x509.ExtKeyUsageServerAuth, now); err == nil {
		t.Fatal("a gateway certificate passed as the control identity")
	}
	if err := VerifyInternalPeer(ctl.Certificate, b.InternalRoots(), ControlSPIFFEID(td), x509.ExtKeyUsageClientAuth, now); err == nil {
		t.Fatal("the control certificate passed as a client")
	}
	if err := VerifyInternalPeer(gw.Certificate, b.NodeRoots(), GatewaySPIFFEID(td), x509.ExtKeyUsageClientAuth, now); err == nil {
		t.Fatal("a certificate passed under another CA")
	}
	if err := VerifyInternalPeer(gw.Certificate, b.InternalRoots(), GatewaySPIFFEID(td), x509.ExtKeyUsageClientAuth, t0.Add(2*time.Hour)); err == nil {
		t.Fatal("an expired certificate passed")
	}
	if err := VerifyInternalPeer(nil, b.InternalRoots(), GatewaySPIFFEID(td), x509.ExtKeyUsageClientAuth, now); err == nil {
		t.Fatal("no certificate passed")
	}
}

// An InternalPeerVerifier accepts a chain it accepted before only within
// that chain's validity, and never accepts what VerifyInternalPeer would
// refuse: another identity, or the same certificate once expired or not
// yet valid.
func TestInternalPeerVerifierRemembersWithinValidity(t *testing.T) {
	b, gw, ctl := internalPeers(t)
	v := NewInternalPeerVerifier(b.InternalRoots(), GatewaySPIFFEID(td), x509.ExtKeyUsageClientAuth)
	now := t0.Add(time.Minute)
	for i := 0; i < 2; i++ { // the second time from the memo
		if err := v.Verify(gw.Certificate, now); err != nil {
			t.Fatalf("gateway, call %d: %v", i, err)
		}
	}
	if err := v.Verify(gw.Certificate, t0.Add(2*time.Hour)); err == nil {
		t.Fatal("a remembered certificate passed after it expired")
	}
	if err := v.Verify(gw.Certificate, t0.Add(-24*time.Hour)); err == nil {
		t.Fatal("a remembered certificate passed before it was valid")
	}
	if err := v.Verify(ctl.Certificate, now); err == nil {
		t.Fatal("the control certificate passed as the gateway")
	}
	if err := v.Verify(nil, now); err == nil {
		t.Fatal("no certificate passed")
	}
	other := NewInternalPeerVerifier(b.NodeRoots(), GatewaySPIFFEID(td), x509.ExtKeyUsageClientAuth)
	if err := other.Verify(gw.Certificate, now); err == nil {
		t.Fatal("a certificate passed under another CA")
	}
}
