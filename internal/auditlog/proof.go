package auditlog

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/note"
)

// ProofHeader is the first line of a proof file (C2SP tlog-proof@v1).
const ProofHeader = "c2sp.org/tlog-proof@v1"

// maxProofFile bounds a proof file: a row, 63 hashes and a checkpoint.
const maxProofFile = 2*MaxRowBytes + 64<<10

// maxProofHashes is the most hashes an inclusion proof in a tree of at most
// 2^63 leaves can have.
const maxProofHashes = 63

// ErrBadProof is returned (wrapped) for a proof file that does not parse;
// test with errors.Is.
var ErrBadProof = errors.New("auditlog: malformed proof")

// Proof is an inclusion proof of one audit row in a signed checkpoint, in the
// C2SP tlog-proof@v1 text form.
type Proof struct {
	Extra      []byte   // the row's canonical encoding (EncodeRow)
	Index      uint64   // the leaf index (= the row's seq)
	Hashes     [][]byte // the inclusion proof, from the leaf's sibling up
	Checkpoint []byte   // the signed checkpoint note, verbatim
}

// Marshal returns the proof file:
//
//	c2sp.org/tlog-proof@v1
//	extra <base64 row>
//	index <N>
//	<base64 hash>   (one per line, from the leaf's sibling up)
//	<blank line>
//	<signed checkpoint note>
func (p Proof) Marshal() []byte {
	var b bytes.Buffer
	b.WriteString(ProofHeader + "\n")
	b.WriteString("extra " + base64.StdEncoding.EncodeToString(p.Extra) + "\n")
	b.WriteString("index " + strconv.FormatUint(p.Index, 10) + "\n")
	for _, h := range p.Hashes {
		b.WriteString(base64.StdEncoding.EncodeToString(h) + "\n")
	}
	b.WriteString("\n")
	b.Write(p.Checkpoint)
	return b.Bytes()
}

// ParseProof parses a proof file strictly: the header line, exactly one
// extra line (canonical base64), an index line (canonical decimal), at most
// 63 canonical base64 SHA-256 hashes, a blank line, then the note. It does
// not check the note or the proof; CheckProof does.
func ParseProof(b []byte) (Proof, error) {
	var p Proof
	if len(b) > maxProofFile {
		return p, fmt.Errorf("%w: too long", ErrBadProof)
	}
	rest := string(b)
	line := func() (string, bool) {
		i := strings.IndexByte(rest, '\n')
		if i < 0 {
			return "", false
		}
		l := rest[:i]
		rest = rest[i+1:]
		return l, true
	}
	if l, ok := line(); !ok || l != ProofHeader {
		return p, fmt.Errorf("%w: first line is not %s", ErrBadProof, ProofHeader)
	}
	l, ok := line()
	extra, found := strings.CutPrefix(l, "extra ")
	if !ok || !found {
		return p, fmt.Errorf("%w: no extra line", ErrBadProof)
	}
	row, err := decodeB64(extra)
	if err != nil || len(row) == 0 {
		return p, fmt.Errorf("%w: extra is not base64", ErrBadProof)
	}
	p.Extra = row
	l, ok = line()
	idx, found := strings.CutPrefix(l, "index ")
	if !ok || !found {
		return p, fmt.Errorf("%w: no index line", ErrBadProof)
	}
	if p.Index, err = parseDecimal(idx); err != nil {
		return p, fmt.Errorf("%w: index: %v", ErrBadProof, err)
	}
	for {
		l, ok = line()
		if !ok {
			return p, fmt.Errorf("%w: no blank line before the checkpoint", ErrBadProof)
		}
		if l == "" {
			break
		}
		if len(p.Hashes) == maxProofHashes {
			return p, fmt.Errorf("%w: too many hashes", ErrBadProof)
		}
		h, err := decodeB64(l)
		if err != nil || len(h) != HashSize {
			return p, fmt.Errorf("%w: hash %d is not base64 of %d bytes", ErrBadProof, len(p.Hashes), HashSize)
		}
		p.Hashes = append(p.Hashes, h)
	}
	if rest == "" {
		return p, fmt.Errorf("%w: no checkpoint", ErrBadProof)
	}
	p.Checkpoint = []byte(rest)
	return p, nil
}

// Verified is what CheckProof proved: the row, and the checkpoint it is
// included in.
type Verified struct {
	Row        Row        `json:"event"`
	Checkpoint Checkpoint `json:"-"`
}

// CheckProof checks a proof file with no server and no database: the note's
// signature under v, its origin (v's deployment and the row's tenant), the
// row's canonical encoding and that its seq is the index, and the inclusion
// of the row's leaf hash in the checkpoint's tree. Any failure is an error.
func CheckProof(file []byte, v note.Verifier) (Verified, error) {
	p, err := ParseProof(file)
	if err != nil {
		return Verified{}, err
	}
	row, err := DecodeRow(p.Extra)
	if err != nil {
		return Verified{}, fmt.Errorf("auditlog: proof: %w", err)
	}
	if uint64(row.Seq) != p.Index {
		return Verified{}, fmt.Errorf("auditlog: proof: index %d but the row's seq is %d", p.Index, row.Seq)
	}
	dep, ok := strings.CutSuffix(v.Name(), "/audit")
	if !ok {
		return Verified{}, fmt.Errorf("auditlog: proof: key %q is not an audit key", v.Name())
	}
	cp, err := OpenCheckpoint(p.Checkpoint, v, Origin(dep, row.TenantID))
	if err != nil {
		return Verified{}, fmt.Errorf("auditlog: proof: %w", err)
	}
	leaf := rfc6962.DefaultHasher.HashLeaf(p.Extra)
	if err := proof.VerifyInclusion(rfc6962.DefaultHasher, p.Index, cp.Size, leaf, p.Hashes, cp.Root); err != nil {
		return Verified{}, fmt.Errorf("auditlog: proof: inclusion: %w", err)
	}
	return Verified{Row: row, Checkpoint: cp}, nil
}
