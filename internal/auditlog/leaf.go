package auditlog

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/transparency-dev/merkle/rfc6962"
)

// LeafMagic opens every canonical row encoding (version 1).
const LeafMagic = "bcaudit1"

// MaxRowBytes bounds a canonical row encoding; longer input is refused
// before anything is allocated for it.
const MaxRowBytes = 1 << 20

// ErrBadRow is returned (wrapped) by DecodeRow for bytes that are not
// exactly one canonical encoding; test with errors.Is.
var ErrBadRow = errors.New("auditlog: not a canonical audit row")

// EncodeRow returns the canonical encoding of r (docs/audit.md, "Leaves"):
//
//	"bcaudit1" | uint64 seq | int64 at_ms |
//	9 x (uint32 length | bytes) for id, tenant, actor, action, resource,
//	outcome, request_id, caller, details
//
// all integers big-endian. It is injective: two different rows never share
// an encoding.
func EncodeRow(r Row) []byte {
	return AppendRow(nil, r)
}

// AppendRow appends the canonical encoding of r to dst (see EncodeRow); it
// lets hot loops reuse one buffer.
func AppendRow(dst []byte, r Row) []byte {
	dst = append(dst, LeafMagic...)
	dst = binary.BigEndian.AppendUint64(dst, uint64(r.Seq))
	dst = binary.BigEndian.AppendUint64(dst, uint64(r.At))
	for _, s := range [...]string{r.ID, r.TenantID, r.Actor, r.Action, r.Resource, r.Outcome, r.RequestID, r.Caller, r.Details} {
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(s)))
		dst = append(dst, s...)
	}
	return dst
}

// DecodeRow parses exactly one canonical encoding. It refuses anything
// else: a wrong magic, a negative sequence, a length past the end, trailing
// bytes, text that is not UTF-8, and any input that does not re-encode to
// the same bytes.
func DecodeRow(b []byte) (Row, error) {
	var r Row
	if len(b) > MaxRowBytes {
		return r, fmt.Errorf("%w: %d bytes is over the limit", ErrBadRow, len(b))
	}
	if len(b) < len(LeafMagic)+16 || string(b[:len(LeafMagic)]) != LeafMagic {
		return r, fmt.Errorf("%w: bad header", ErrBadRow)
	}
	p := b[len(LeafMagic):]
	seq := binary.BigEndian.Uint64(p)
	if seq > 1<<62 {
		return r, fmt.Errorf("%w: sequence out of range", ErrBadRow)
	}
	r.Seq = int64(seq)
	r.At = int64(binary.BigEndian.Uint64(p[8:]))
	p = p[16:]
	fields := [...]*string{&r.ID, &r.TenantID, &r.Actor, &r.Action, &r.Resource, &r.Outcome, &r.RequestID, &r.Caller, &r.Details}
	for i, f := range fields {
		if len(p) < 4 {
			return Row{}, fmt.Errorf("%w: field %d truncated", ErrBadRow, i)
		}
		n := binary.BigEndian.Uint32(p)
		p = p[4:]
		if uint64(n) > uint64(len(p)) {
			return Row{}, fmt.Errorf("%w: field %d longer than the input", ErrBadRow, i)
		}
		if !utf8.Valid(p[:n]) {
			return Row{}, fmt.Errorf("%w: field %d is not UTF-8", ErrBadRow, i)
		}
		*f = string(p[:n])
		p = p[n:]
	}
	if len(p) != 0 {
		return Row{}, fmt.Errorf("%w: %d trailing bytes", ErrBadRow, len(p))
	}
	if !bytes.Equal(EncodeRow(r), b) {
		return Row{}, fmt.Errorf("%w: not canonical", ErrBadRow)
	}
	return r, nil
}

// LeafHash returns the RFC 6962 leaf hash of r's canonical encoding.
func LeafHash(r Row) []byte {
	return rfc6962.DefaultHasher.HashLeaf(EncodeRow(r))
}
