// Package previews serves sandbox preview URLs: sandboxes.preview issues
// a URL carrying a token (internal/sandboxes/previewtoken) signed by the
// preview key, scoped to one sandbox, one port and an expiry, and the
// preview role's proxy forwards each request under that URL (WebSocket
// upgrades too) to 127.0.0.1:<port> inside the sandbox, through the host
// over the node's session: a ticket for the preview action signed by a
// worker key, verified and spent by the gateway and again by the node,
// which dials from inside the sandbox's network namespace.
//
// A preview URL reads
//
//	<base>/p/<sandbox>/<port>/<token>/<path…>
//
// The proxy verifies the token against the sandbox and port the URL names
// before anything else, then looks the sandbox up (it must be the token's
// tenant's and running); any failure is the same plain 404, so a tampered,
// expired, other-sandbox, other-port or old-key token and a deleted
// sandbox look alike and reach no host. The prefix up to the token is
// stripped before forwarding, so an app's relative links stay under it.
//
// The design is cookie-less: every preview shares the proxy's origin (and
// browsers send a host's cookies to every port of it), so the proxy drops
// Cookie from requests and Set-Cookie and Service-Worker-Allowed from
// answers, and tells browsers never to send the URL (and its token) as a
// Referer.
//
// The preview key is generated once, sealed at rest under the KEK, and
// rotated by previews.rotateKey: the proxy reads the current public key on
// every request, so a rotation kills every older token at once.
package previews
