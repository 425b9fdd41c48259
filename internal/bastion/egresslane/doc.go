// Package egresslane is the bastion's egress lane: the control plane (CP)
// opens connections that leave from the bastion's machine, to the public
// internet only.
//
// The bastion dials out. It keeps Workers (default 2) connections parked on
// the CP's egress listener inside the tunnel; the CP's Dispatcher hands a
// parked worker one job, the worker checks it and either refuses it with a
// reason or dials the target through the egress guard (internal/netguard:
// resolve once, check every address, dial only the checked addresses) and
// splices the two connections. The address rules live in netguard alone;
// this package passes netguard's refusal reasons through unchanged.
//
// # Wire
//
// Every line is one JSON object followed by "\n", at most MaxLine bytes
// with the newline. Lines are decoded strictly: exactly the listed keys,
// spelled exactly, each at most once, with the listed JSON types, valid
// UTF-8, nothing after the object.
//
//	worker → CP  hello    {"v":1}
//	CP → worker  job      {"v":1,"target":"host:port"}
//	worker → CP  verdict  {"ok":true}  or  {"ok":false,"reason":"<reason>"}
//
// The target's host is a DNS name (letters, digits, '-' and '_' in labels
// of at most 63 bytes, 253 bytes in all, one trailing dot allowed), an IPv4
// address, or a bracketed IPv6 address without a zone; the port is 1 to
// 65535 in decimal without leading zeros. After {"ok":true} the connection
// carries raw bytes both ways between the CP and the target. A reason is
// lowercase letters, digits and '-', at most 64 bytes.
//
// # Refusals
//
// A job is refused with ReasonMalformedJob (the line is not a job),
// ReasonNotGranted (the pairing's grants do not hold the egress family,
// read per job), ReasonBusy (MaxActive spliced connections are live),
// netguard's reason (loopback, private, this-machine, ...) or
// ReasonDialFailed (the target refused or did not answer). A worker whose
// job was refused, or whose parked connection ended without a job, or that
// could not reach the CP, waits Backoff (1 s) on the injected clock before
// it parks again, so a CP that refuses or misuses every job cannot make the
// machine dial in a loop. A worker that took a job parks again at once; the
// spliced connection lives on in its own goroutine.
package egresslane
