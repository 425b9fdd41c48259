// Package previewtoken issues and verifies the tokens of sandbox preview
// URLs (`sandboxes.preview`). A token is signed by the preview key and
// scoped to exactly one sandbox, one port and an expiry; the preview proxy
// verifies it before it forwards a request to that port, and refuses a
// tampered, expired, unknown-key or other-scope token with a typed
// RefusedError (the proxy answers 404 and reaches no host).
//
// # Format
//
// A token reads
//
//	v1.<kid>.<payload>.<sig>
//
// where kid is the key id (16 lowercase hex digits: the first 8 bytes of
// SHA-256 of the Ed25519 public key), payload is the unpadded base64url of
// the claims as compact JSON {"sbx":…,"port":…,"exp":…,"tnt":…} (exp in
// Unix nanoseconds) and sig is the unpadded base64url Ed25519 signature
// over
//
//	"bc-preview-v1\x00" || "v1." || kid || "." || payload
//
// that is, over the domain-separation context followed by the token's
// bytes up to its last dot. Every character is in [A-Za-z0-9._-], so a
// token is a valid URL path segment without escaping; it is at most
// MaxTokenLen bytes.
//
// # Why not JWS
//
// go-jose (in go.mod) would give compact JWS with EdDSA pinned, but a JWS
// header is attacker-chosen JSON that is parsed before the signature is
// checked, its encoding is not canonical (key order, whitespace, escapes
// and extra header fields all verify), and it carries no domain
// separation. To get the properties the proxy needs (one canonical string
// per claims, a size cap and a character check before any decode, nothing
// parsed before the signature verifies, tokens of no other protocol ever
// accepted) every one of those checks would have to be written around
// go-jose anyway, leaving it only the base64 and the Ed25519 call. So the
// format is this fixed one, and the cryptography is the standard
// library's: crypto/ed25519 (which refuses non-canonical signatures, so a
// signature cannot be re-encoded) and encoding/base64 in strict mode.
//
// # Keys and rotation
//
// A Key holds the private seed; it never prints (String, Format, GoString
// and LogValue redact it) and is stored sealed via MarshalSeed and
// KeyFromSeed. A Verifier holds only public keys: exactly those it was
// made with. Rotating the preview key means making a new Verifier with
// only the new key, after which every token signed by the old key is
// refused ReasonUnknownKey. There is no implicit grace: a caller that
// wants one passes the old key too, explicitly, and its tokens then live
// no longer than their own expiry, which Issue bounds by maxTTL.
package previewtoken
