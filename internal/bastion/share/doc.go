// Package share is the bastion's shared folders: the folders the person
// shares with a pairing from the machine (`bcd bastion share --data DIR
// PATH --exclude PATTERN...`), kept in DIR/shares.json, and the file ops
// the control plane may run in them: list, stat, read, and a move plan the
// person approved, which archives and never deletes.
//
// A share serves only what its excludes leave in:
//
//   - Every path is relative, holds no "..", no NUL and at most 4096 bytes
//     (ReasonPathInvalid).
//   - A path is resolved component by component inside the folder (Lstat,
//     Readlink, substitute; at most 40 links, ReasonLinkLoop). The
//     excludes and ".agent" are checked on the path as given AND on every
//     path the resolution passes through, so a link cannot lead into an
//     excluded folder or into ".agent" (ReasonExcluded,
//     ReasonAgentFolder). A link that is absolute or climbs out of the
//     folder is refused (ReasonLinkOutside).
//   - The resolved path, which holds no link, is then opened through an
//     os.Root on the folder, which refuses an escape by itself too, and
//     the opened file must be the one resolved (ReasonPathChanged).
//   - A pattern of one name matches a component equal to it at any depth
//     (path.Match globs within a component); a pattern with "/" matches
//     that run of consecutive components at any depth. ".agent" (the local
//     search agent's folder, which holds the plaintext of what it read) is
//     excluded at any depth whatever the patterns.
//   - A listing leaves excluded names out.
//   - There is no delete. A move plan moves each From to its To, or, with
//     To "", to Archive/<YYYY-MM-DD>/<From>. Moving a link moves the link,
//     never its target. A move into or out of an excluded or ".agent" path,
//     or of a folder holding one, is refused. Every rule is checked again
//     at apply, and each rename is one that never replaces an existing
//     name (renameat2 RENAME_NOREPLACE on Linux, renameatx_np RENAME_EXCL
//     on macOS; other systems refuse moves), so no existing file is ever
//     overwritten (ReasonDestinationExists).
//
// What it does not defend: a process on this machine racing the checks
// (the os.Root still keeps every open inside the folder, and the opened
// file is compared with the one checked); case-insensitive or
// normalising file systems (macOS), where a pattern matches the name as
// spelled in the path, not every spelling that opens the same file.
package share
