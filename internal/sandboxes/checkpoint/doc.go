// Package checkpoint captures a sandbox's writable layer as a checkpoint
// and brings it back, confined.
//
// A checkpoint is a deterministic tar of the layer, zstd-compressed,
// addressed by the SHA-256 of its compressed bytes ("sha256:<hex>") and
// kept in an object store (Store, over gocloud.dev/blob). Pack writes one
// from a directory; Materialize restores one into a new sandbox's own,
// empty directory.
//
// Materialization is confined because a checkpoint is tenant data: the
// tenant controlled every byte of the layer, and a store may have been
// tampered with. Materialize therefore spools the archive and checks its
// digest before a single byte is decompressed, decompresses with a bounded
// window and bounded output, and extracts only through an os.Root opened
// on the target directory. It refuses (never silently drops) absolute
// names, ".." elements, non-canonical names, symbolic links that leave the
// root, hard links to anything but an earlier regular file of the archive,
// device nodes, FIFOs and every other entry type, set-user-ID and
// set-group-ID bits, duplicate names, entries whose parent is not an
// earlier directory of the archive, bytes after the tar's end, and
// archives over the size and entry caps. With Limits.Whiteouts (for an
// overlay's upper layer) exactly two overlayfs forms are carried: a
// character device 0/0 with no mode bits beyond 0777 (a whiteout, made
// with mknodat in its parent opened through the root) and the
// "trusted.overlay.opaque" attribute with value "y" on a directory; every
// other device is still refused and every other attribute is neither
// recorded nor applied. Each refusal is a *RefusedError carrying a constant Reason; on a
// refusal the target directory is emptied again, so a caller sees either a
// complete checkpoint or an empty directory.
//
// Owners and times are not part of a checkpoint: Pack records uid and gid
// 0, no user or group names and the Unix epoch, and Materialize applies no
// owner (files belong to the caller, who applies the sandbox's own id
// mapping). Permission bits and the sticky bit are kept.
package checkpoint
