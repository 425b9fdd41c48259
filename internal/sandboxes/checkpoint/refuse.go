package checkpoint

import (
	"errors"
	"fmt"
)

// Refusal reasons: the stable codes a *RefusedError carries. Callers and
// tests match on these, never on Error's text.
const (
	// ReasonDigestMismatch: the archive's bytes do not hash to the digest asked for.
	ReasonDigestMismatch = "checkpoint-digest-mismatch"
	// ReasonBadDigest: a digest string is not "sha256:" and 64 lower-case hex digits.
	ReasonBadDigest = "checkpoint-bad-digest"
	// ReasonAbsolutePath: an entry name starts with "/".
	ReasonAbsolutePath = "checkpoint-absolute-path"
	// ReasonDotDot: an entry name has a ".." element.
	ReasonDotDot = "checkpoint-dotdot"
	// ReasonBadName: an entry name is empty, not canonical ("./a", "a//b",
	// "a/."), holds a NUL or a backslash, or is over the length bounds.
	ReasonBadName = "checkpoint-bad-name"
	// ReasonDuplicate: two entries have the same name.
	ReasonDuplicate = "checkpoint-duplicate"
	// ReasonParent: an entry's parent is not an earlier directory entry of
	// the archive (so no entry is ever written through a link).
	ReasonParent = "checkpoint-parent-not-dir"
	// ReasonLinkEscapes: a symbolic link's target leaves the root, or is empty.
	ReasonLinkEscapes = "checkpoint-link-escapes"
	// ReasonHardLink: a hard link is to anything but an earlier regular file of the archive.
	ReasonHardLink = "checkpoint-hard-link"
	// ReasonDevice: a character or block device node.
	ReasonDevice = "checkpoint-device"
	// ReasonFIFO: a named pipe.
	ReasonFIFO = "checkpoint-fifo"
	// ReasonOtherType: any other entry type (sockets, sparse files, vendor types).
	ReasonOtherType = "checkpoint-entry-type"
	// ReasonSetID: a set-user-ID or set-group-ID bit.
	ReasonSetID = "checkpoint-setid"
	// ReasonTooLarge: the archive, its unpacked files or its decompressed
	// stream is over its cap.
	ReasonTooLarge = "checkpoint-too-large"
	// ReasonTooManyEntries: more entries than Limits.MaxEntries.
	ReasonTooManyEntries = "checkpoint-too-many-entries"
	// ReasonCorrupt: the bytes are not one zstd-compressed tar (truncated, a
	// bad frame or checksum, a window over 8 MiB, bytes after the tar's end,
	// mode bits beyond 07777, a size on a non-file entry).
	ReasonCorrupt = "checkpoint-corrupt"
	// ReasonNotEmpty: Materialize's target directory is not empty.
	ReasonNotEmpty = "checkpoint-dir-not-empty"
)

// Reasons lists every refusal reason, for tests and for callers that map
// reasons to their own codes.
func Reasons() []string {
	return []string{
		ReasonDigestMismatch, ReasonBadDigest, ReasonAbsolutePath, ReasonDotDot,
		ReasonBadName, ReasonDuplicate, ReasonParent, ReasonLinkEscapes,
		ReasonHardLink, ReasonDevice, ReasonFIFO, ReasonOtherType, ReasonSetID,
		ReasonTooLarge, ReasonTooManyEntries, ReasonCorrupt, ReasonNotEmpty,
	}
}

// RefusedError is a refusal: Reason is one of the Reason constants, Detail
// says which entry and why, for logs and operators. Detail quotes tenant
// data (entry names); send only Reason to an untrusted client.
type RefusedError struct {
	Reason string
	Detail string
}

// Error renders the refusal as "checkpoint: <reason>: <detail>".
func (e *RefusedError) Error() string {
	if e.Detail == "" {
		return "checkpoint: " + e.Reason
	}
	return "checkpoint: " + e.Reason + ": " + e.Detail
}

// ReasonOf returns the Reason of the *RefusedError in err's chain, or ""
// when err is not a refusal (nil, or an I/O error).
func ReasonOf(err error) string {
	var re *RefusedError
	if errors.As(err, &re) {
		return re.Reason
	}
	return ""
}

// refuse builds a *RefusedError with a formatted detail.
func refuse(reason, format string, args ...any) error {
	return &RefusedError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}
