package checkpoint

// Limits bounds one checkpoint. Pack refuses to write a checkpoint that
// Materialize would refuse under the same Limits.
type Limits struct {
	// MaxArchiveBytes caps the compressed archive (what is spooled and stored).
	MaxArchiveBytes int64
	// MaxUnpackedBytes caps the sum of the regular files' sizes.
	MaxUnpackedBytes int64
	// MaxEntries caps the number of tar entries.
	MaxEntries int
	// Whiteouts carries overlayfs whiteouts and opaque directories, for a
	// directory that is an overlay's upper layer: Pack records a character
	// device 0/0 (a whiteout) as such an entry and a directory whose
	// "trusted.overlay.opaque" attribute is "y" with that one attribute,
	// and Materialize recreates exactly those two forms (mknod 0/0, the
	// attribute on the directory). Every other device stays refused
	// (ReasonDevice) and every other attribute is neither recorded nor
	// applied. Off, whiteouts are refused like any device.
	Whiteouts bool
	// SpoolDir is where Materialize spools the archive while hashing it
	// (an unlinked temporary file); empty means os.TempDir. It must not be
	// inside the target directory.
	SpoolDir string
}

// DefaultLimits are the bounds for a sandbox's writable layer: 2 GiB
// compressed, 8 GiB unpacked, 500 000 entries.
func DefaultLimits() Limits {
	return Limits{MaxArchiveBytes: 2 << 30, MaxUnpackedBytes: 8 << 30, MaxEntries: 500_000}
}

// entryOverhead is what the decompressed stream may hold per entry beyond
// file contents (header, PAX records for a long name, padding); the
// stream is capped at MaxUnpackedBytes plus this per entry.
const entryOverhead = 8 << 10

// streamCap is the most decompressed bytes Materialize reads.
func (l Limits) streamCap() int64 {
	return l.MaxUnpackedBytes + int64(l.MaxEntries+2)*entryOverhead
}
