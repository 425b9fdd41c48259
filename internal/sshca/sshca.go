// Package sshca is the break-glass SSH certificate authority and the
// sshd side of it: it signs short OpenSSH user certificates for one
// account on one node, writes OpenSSH key revocation lists (KRLs) that
// sshd and ssh-keygen read, and writes the files a node's sshd trusts
// (the CA key, a principals file per account, the KRL).
//
// Why a package of its own: every rule of break-glass access that sshd
// itself enforces lives here, in one place, tested against the real
// OpenSSH binaries. The certificate is signed with golang.org/x/crypto/ssh;
// only the KRL writer is our own (x/crypto/ssh has no KRL support).
//
// Refusals are internal/errs errors whose safe message starts with one of
// the Reason constants and a colon, so a caller (and a test) can tell them
// apart by a stable string.
package sshca

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"fmt"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/ids"
)

// MaxValidity is the longest a break-glass certificate is valid.
const MaxValidity = time.Hour

// Backdate is how far before the signing time a certificate starts to be
// valid, so that a node whose clock is a little behind the control
// plane's still accepts a fresh certificate. The end of validity moves
// back by as much, so the whole window is never longer than MaxValidity.
const Backdate = 30 * time.Second

// ExtensionPermitPTY is the only extension a certificate carries: an
// interactive terminal, and no agent, X11 or port forwarding, no user rc.
const ExtensionPermitPTY = "permit-pty"

// Reasons a request is refused. Each is the start of the refusal's safe
// message, followed by ": " and a detail.
const (
	ReasonKeyMalformed      = "ssh-key-malformed"      // not one authorized_keys line with one public key
	ReasonKeyIsCertificate  = "ssh-key-is-certificate" // a certificate, not a plain key
	ReasonKeyTypeRefused    = "ssh-key-type-refused"   // DSA or another type not on the list
	ReasonKeyTooWeak        = "ssh-key-too-weak"       // RSA under MinRSABits
	ReasonAccountInvalid    = "ssh-account-invalid"    // not a Unix account name
	ReasonNodeInvalid       = "ssh-node-invalid"       // empty or not a node id
	ReasonCredentialExpired = "ssh-credential-expired" // the caller's credential ends before the next second
	ReasonSerialZero        = "ssh-serial-zero"        // serial 0 cannot be revoked in a KRL
	ReasonCAInvalid         = "ssh-ca-invalid"         // no CA, or a CA that is a certificate
)

// MinRSABits and MaxRSABits bound an RSA user key's modulus.
const (
	MinRSABits = 2048
	MaxRSABits = 16384
)

// MaxPublicKeyLine bounds the request's public key line in bytes; a
// 16384-bit RSA key with a comment fits easily.
const MaxPublicKeyLine = 8192

// Request asks for one break-glass certificate.
type Request struct {
	PublicKey []byte    // one authorized_keys line: "type base64 [comment]", no options
	Account   string    // the Unix account on the node (ValidAccount)
	NodeID    string    // the node the certificate is for
	Serial    uint64    // the certificate's serial, unique per CA, never 0
	NotAfter  time.Time // the caller's credential expiry; the certificate ends no later
}

// refuse makes a coded refusal whose safe message is "reason: detail".
func refuse(code errs.Code, reason, detail string) error {
	return errs.New(code, reason+": "+detail)
}

// Principal is the one principal a certificate for account on node
// carries, and the one line of that account's principals file there.
func Principal(account, nodeID string) string { return account + "@" + nodeID }

// ValidNodeID reports whether s can name a node in a principal: the
// rule of ids.ValidName (what node ids and names are made of), so that a
// principal is always one token with no space, comma or '@' but its own.
func ValidNodeID(s string) bool { return ids.ValidName(s) }

// Issue signs a user certificate for req with ca at time now: principal
// Principal(account, node) only, valid from now-Backdate for at most
// MaxValidity and never past req.NotAfter, with permit-pty as its only
// extension and no critical options. It refuses (errs.InvalidInput) a bad
// public key, account, node or serial and a credential already expired,
// and (errs.InvalidConfig) a missing CA or a CA that is a certificate.
func Issue(ca ssh.Signer, req Request, now time.Time) (*ssh.Certificate, error) {
	if ca == nil {
		return nil, refuse(errs.InvalidConfig, ReasonCAInvalid, "no certificate authority configured")
	}
	if _, isCert := ca.PublicKey().(*ssh.Certificate); isCert {
		return nil, refuse(errs.InvalidConfig, ReasonCAInvalid, "the certificate authority is a certificate, not a key")
	}
	key, err := ParsePublicKey(req.PublicKey)
	if err != nil {
		return nil, err
	}
	if !ValidAccount(req.Account) {
		return nil, refuse(errs.InvalidInput, ReasonAccountInvalid, "account must match ^[a-z_][a-z0-9_-]{0,31}$")
	}
	if !ValidNodeID(req.NodeID) {
		return nil, refuse(errs.InvalidInput, ReasonNodeInvalid, ids.NameRule)
	}
	if req.Serial == 0 {
		return nil, refuse(errs.InvalidInput, ReasonSerialZero, "serial must not be 0 (a KRL cannot revoke it)")
	}
	// Whole seconds, floored: the certificate never outlives the credential.
	if req.NotAfter.Unix() <= now.Unix() {
		return nil, refuse(errs.InvalidInput, ReasonCredentialExpired, "the caller's credential has expired")
	}
	after := now.Add(-Backdate).Unix()
	before := min(after+int64(MaxValidity/time.Second), req.NotAfter.Unix())
	cert := &ssh.Certificate{
		Key:             key,
		Serial:          req.Serial,
		CertType:        ssh.UserCert,
		KeyId:           fmt.Sprintf("bc-break-glass serial=%d account=%s node=%s", req.Serial, req.Account, req.NodeID),
		ValidPrincipals: []string{Principal(req.Account, req.NodeID)},
		ValidAfter:      uint64(after),
		ValidBefore:     uint64(before),
		Permissions: ssh.Permissions{
			CriticalOptions: map[string]string{},
			Extensions:      map[string]string{ExtensionPermitPTY: ""},
		},
	}
	if err := cert.SignCert(rand.Reader, ca); err != nil {
		return nil, errs.Wrap(errs.Internal, "signing the certificate failed", err)
	}
	return cert, nil
}

// errKeyMalformed is the refusal for input that is not one public key line.
func errKeyMalformed(detail string) error {
	return refuse(errs.InvalidInput, ReasonKeyMalformed, detail)
}

// ParsePublicKey parses a request's public key: exactly one
// authorized_keys line ("type base64 [comment]", an optional final
// newline or CRLF), no options, no second line, a plain key (not a certificate) of
// an accepted type. ssh.ParseAuthorizedKey alone skips lines it cannot
// parse and accepts options, so the line is checked around it.
func ParsePublicKey(line []byte) (ssh.PublicKey, error) {
	if len(line) == 0 {
		return nil, errKeyMalformed("public key is empty")
	}
	if len(line) > MaxPublicKeyLine {
		return nil, errKeyMalformed(fmt.Sprintf("public key line is over %d bytes", MaxPublicKeyLine))
	}
	body := bytes.TrimSuffix(bytes.TrimSuffix(line, []byte("\n")), []byte("\r"))
	for _, c := range body {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return nil, errKeyMalformed("public key must be one line without control characters")
		}
	}
	key, _, options, rest, err := ssh.ParseAuthorizedKey(body)
	switch {
	case err != nil:
		return nil, errs.Wrap(errs.InvalidInput, ReasonKeyMalformed+": not an SSH public key", err)
	case len(options) > 0:
		return nil, errKeyMalformed("public key must not carry authorized_keys options")
	case len(rest) > 0:
		return nil, errKeyMalformed("public key must be one line") // unreachable: no newline in body
	}
	if err := checkKeyType(key); err != nil {
		return nil, err
	}
	return key, nil
}

// checkKeyType accepts Ed25519, ECDSA (NIST P-256/384/521), their FIDO
// security-key forms, and RSA of MinRSABits to MaxRSABits bits; it refuses
// certificates, DSA and anything else (fail closed: a new type is added
// here on purpose, not by default).
func checkKeyType(key ssh.PublicKey) error {
	if _, ok := key.(*ssh.Certificate); ok {
		return refuse(errs.InvalidInput, ReasonKeyIsCertificate, "a certificate is not accepted as a public key")
	}
	switch key.Type() {
	case ssh.KeyAlgoED25519, ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521,
		ssh.KeyAlgoSKED25519, ssh.KeyAlgoSKECDSA256:
		return nil
	case ssh.KeyAlgoRSA:
		bits, err := rsaBits(key)
		if err != nil {
			return err
		}
		if bits < MinRSABits || bits > MaxRSABits {
			return refuse(errs.InvalidInput, ReasonKeyTooWeak,
				fmt.Sprintf("RSA keys must have %d to %d bits", MinRSABits, MaxRSABits))
		}
		return nil
	default:
		return refuse(errs.InvalidInput, ReasonKeyTypeRefused,
			"key type must be ssh-ed25519, ecdsa-sha2-nistp256/384/521, a security key of those, or ssh-rsa")
	}
}

// errNotRSA is the cause when an ssh-rsa key has no RSA public key inside.
var errNotRSA = errors.New("ssh-rsa key without an RSA public key")

// rsaBits returns the modulus size of an ssh-rsa key.
func rsaBits(key ssh.PublicKey) (int, error) {
	ck, ok := key.(ssh.CryptoPublicKey)
	if !ok {
		return 0, errs.Wrap(errs.InvalidInput, ReasonKeyMalformed+": not an SSH public key", errNotRSA)
	}
	pub, ok := ck.CryptoPublicKey().(*rsa.PublicKey)
	if !ok {
		return 0, errs.Wrap(errs.InvalidInput, ReasonKeyMalformed+": not an SSH public key", errNotRSA)
	}
	return pub.N.BitLen(), nil
}
