package sshca

import (
	"encoding/binary"
	"slices"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/bettercompute/bettercompute/internal/errs"
)

// The parts of OpenSSH's KRL format (PROTOCOL.krl) that KRL.Marshal writes.
const (
	krlMagic              = 0x5353484b524c0a00 // "SSHKRL\n\0"
	krlFormatVersion      = 1
	krlSectionCerts       = 1
	krlSectionSerialList  = 0x20
	krlMaxSerialsPerBlock = 1 << 16 // keeps each subsection well under sshd's buffer limits
)

// KRL is a key revocation list in OpenSSH's own format, as sshd's
// RevokedKeys and `ssh-keygen -Q` read it: the certificates CA issued
// whose serial is in Serials are revoked.
//
// Why our own writer: golang.org/x/crypto/ssh neither reads nor writes
// KRLs, and shelling out to ssh-keygen on the control plane would tie it
// to a binary. Only the certificate section with serial lists is written;
// that is all break-glass revocation needs.
type KRL struct {
	CA        ssh.PublicKey // the CA whose certificates are revoked
	Version   uint64        // krl_version: grows with every change
	Serials   []uint64      // revoked serials (any order, duplicates allowed; never 0)
	Generated time.Time     // generated_date, in whole seconds
}

// Marshal encodes the KRL: the header (magic, format version 1,
// krl_version, generated date, no flags, empty reserved field and
// comment) and, when there are serials, one certificates section for CA
// holding sorted serial lists. It refuses (errs.InvalidConfig) a missing
// CA, a CA that is a certificate, and serial 0, which OpenSSH refuses to
// load, so that a node never gets a KRL sshd would not read.
func (k KRL) Marshal() ([]byte, error) {
	if k.CA == nil {
		return nil, refuse(errs.InvalidConfig, ReasonCAInvalid, "KRL needs the certificate authority's public key")
	}
	if _, isCert := k.CA.(*ssh.Certificate); isCert {
		return nil, refuse(errs.InvalidConfig, ReasonCAInvalid, "the certificate authority is a certificate, not a key")
	}
	serials := slices.Clone(k.Serials)
	slices.Sort(serials)
	serials = slices.Compact(serials)
	if len(serials) > 0 && serials[0] == 0 {
		return nil, refuse(errs.InvalidConfig, ReasonSerialZero, "serial 0 cannot be revoked in a KRL")
	}
	generated := max(k.Generated.Unix(), 0)

	out := binary.BigEndian.AppendUint64(nil, krlMagic)
	out = binary.BigEndian.AppendUint32(out, krlFormatVersion)
	out = binary.BigEndian.AppendUint64(out, k.Version)
	out = binary.BigEndian.AppendUint64(out, uint64(generated))
	out = binary.BigEndian.AppendUint64(out, 0) // flags: none defined
	out = appendString(out, nil)                // reserved
	out = appendString(out, nil)                // comment
	if len(serials) == 0 {
		return out, nil
	}
	section := appendString(nil, k.CA.Marshal())
	section = appendString(section, nil) // reserved
	for chunk := range slices.Chunk(serials, krlMaxSerialsPerBlock) {
		var list []byte
		for _, s := range chunk {
			list = binary.BigEndian.AppendUint64(list, s)
		}
		section = append(section, krlSectionSerialList)
		section = appendString(section, list)
	}
	out = append(out, krlSectionCerts)
	return appendString(out, section), nil
}

// appendString appends an SSH wire string: a uint32 length and the bytes.
func appendString(b, s []byte) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}
