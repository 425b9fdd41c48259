// Package action runs an action op: a /bin/sh program the control plane
// wrote, which may change only the files it declares (its effects) in one
// shared folder, and only after the person saw what it would change.
//
// An action op runs twice at most, and differently each time:
//
//   - DryRun runs the program in a fresh runc (or runsc) container with no
//     network: a new network namespace holding only loopback, so neither
//     the internet, nor this machine's own services, nor the LAN is
//     reachable from inside. The root filesystem is a read-only busybox
//     image; the declared effects that exist are copied (never bound) into
//     a size-limited tmpfs at /work, the only writable place besides /tmp;
//     the inputs the program names are fetched beforehand, here, through
//     the egress guard (internal/netguard) and mounted read-only at
//     /inputs. The program runs as nobody with no capabilities, no new
//     privileges, a seccomp filter, rlimits and cgroup limits, and the
//     container is deleted after. The change list is read from the copies:
//     every declared effect whose bytes changed or that was created.
//     Nothing is ever deleted, so a deleted effect is not a change, and a
//     file the program made that it did not declare is ignored: it is
//     never landed. The changed bytes, the originals' SHA-256 and the
//     input hosts are kept under the state folder as a plan.
//   - Apply lands exactly the plan the person saw, named by its id and the
//     digest of its change list, once: the plan is spent by the first
//     apply that names its digest, whatever that apply's outcome. Before
//     any write, every input host is resolved again and every address
//     checked, and every original must still be as the dry run found it
//     (else the plan is stale). Each file is written through os.Root of
//     the folder (temporary file and rename), so no link leads a write out
//     of it.
//
// Destinations: on a machine no fleet anchored, an input's host is never
// a private, ULA, CGNAT, reserved, loopback or link-local address, this
// machine, or such an address inside NAT64 (64:ff9b::/96) or 6to4
// (2002::/16); a host written as an address is refused when the op
// arrives (Check), a name at fetch and again at apply for every address it
// resolves to. An anchored machine keeps private destinations, but never
// loopback, link-local, a cloud metadata address or this machine.
//
// Not defended here: the window between the stale check and the rename of
// each file at apply (a program on this machine that changes an effect in
// that window loses its change), and whatever root on this machine does.
// Every refusal is a *RefusedError with a stable Reason.
package action
