package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"time"
)

// SessionCookie is the API's session cookie (api.SessionCookie): the
// console sets the very cookie the API reads, so a console session is an
// API session, revoked, expired and limited exactly as one.
const SessionCookie = "bc_session"

// CSRFField is the hidden form field that carries the CSRF token.
const CSRFField = "csrf"

// csrfLabel keys the CSRF token's derivation, so the token is no other
// MAC of the session value.
const csrfLabel = "better-compute console csrf v1"

// session is a signed-in request's credential and its CSRF token.
type session struct {
	value string
	csrf  string
}

// CSRFToken is the CSRF token of a session value: HMAC-SHA256 keyed by
// the session value. Only the holder of the HttpOnly cookie can compute
// it, so another site's form cannot carry it; it plays the part the
// X-Better-Compute header plays for the API, which a plain form cannot
// set either.
func CSRFToken(sessionValue string) string {
	m := hmac.New(sha256.New, []byte(sessionValue))
	m.Write([]byte(csrfLabel))
	return hex.EncodeToString(m.Sum(nil))
}

// sessionOf returns the request's session, or false when it carries no
// session cookie.
func sessionOf(r *http.Request) (session, bool) {
	ck, err := r.Cookie(SessionCookie)
	if err != nil || ck.Value == "" {
		return session{}, false
	}
	return session{value: ck.Value, csrf: CSRFToken(ck.Value)}, true
}

// signedIn runs h for a request with a session; any other is redirected
// to the sign-in page.
func (c *Console) signedIn(h func(w http.ResponseWriter, r *http.Request, s session)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s, ok := sessionOf(r)
		if !ok {
			redirect(w, r, Prefix+"signin")
			return
		}
		h(w, r, s)
	}
}

// mutation runs h for a form POST only when its Origin is exactly the
// deployment's (the API's rule: none is CSRF_REJECTED, another is
// UNTRUSTED_ORIGIN) and its CSRF field is the session's token; else it
// answers 403 and does nothing. Without a session it redirects to sign-in.
func (c *Console) mutation(h func(w http.ResponseWriter, r *http.Request, s session)) http.HandlerFunc {
	return c.signedIn(func(w http.ResponseWriter, r *http.Request, s session) {
		if e := c.checkOrigin(r); e != nil {
			c.render(w, r, http.StatusForbidden, "error", page{Title: "Refused", Error: e})
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
		got := r.PostFormValue(CSRFField)
		if !hmac.Equal([]byte(got), []byte(s.csrf)) {
			c.render(w, r, http.StatusForbidden, "error", page{Title: "Refused", Error: &apiError{Code: "CSRF_REJECTED", Message: "the form's CSRF token is missing or not this session's"}})
			return
		}
		h(w, r, s)
	})
}

// checkOrigin applies the API's exact-Origin rule to a console POST.
func (c *Console) checkOrigin(r *http.Request) *apiError {
	switch o := r.Header.Get("Origin"); {
	case o == "":
		return &apiError{Code: "CSRF_REJECTED", Message: "a console form needs an Origin header"}
	case o != c.origin:
		return &apiError{Code: "UNTRUSTED_ORIGIN", Message: "the Origin is not this deployment's"}
	}
	return nil
}

// setCookie sets (or, with an empty value, clears) the session cookie:
// HttpOnly, SameSite=Strict, Path=/ (the API reads it too), Secure when
// served over TLS.
func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, value string, expires time.Time) {
	ck := &http.Cookie{Name: SessionCookie, Value: value, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: c.secure || r.TLS != nil}
	if value == "" {
		ck.MaxAge = -1
	} else {
		ck.Expires = expires
	}
	http.SetCookie(w, ck)
}

// signInPage shows the sign-in form.
func (c *Console) signInPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "signin", page{Title: "Sign in"})
}

// signIn trades the pasted API key for a session through the API's
// sessions.create (the key authenticates that one call as a bearer
// credential) and sets the session cookie. The key is never stored,
// logged or echoed.
func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	if e := c.checkOrigin(r); e != nil {
		c.render(w, r, http.StatusForbidden, "error", page{Title: "Refused", Error: e})
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	key := strings.TrimSpace(r.PostFormValue("api_key"))
	if key == "" {
		c.render(w, r, http.StatusBadRequest, "signin", page{Title: "Sign in", Error: &apiError{Code: "INVALID_INPUT", Message: "paste an API key"}})
		return
	}
	var out struct {
		Value     string    `json:"value"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if e := c.call(r, credential{bearer: key}, "sessions.create", struct{}{}, &out); e != nil {
		c.render(w, r, e.status(), "signin", page{Title: "Sign in", Error: e})
		return
	}
	c.setCookie(w, r, out.Value, out.ExpiresAt)
	redirect(w, r, Prefix+"fleet")
}

// signOut revokes the calling session through the API's sessions.revoke
// and clears the cookie.
func (c *Console) signOut(w http.ResponseWriter, r *http.Request, s session) {
	e := c.call(r, credential{session: s.value}, "sessions.revoke", struct{}{}, nil)
	c.setCookie(w, r, "", time.Time{})
	if e != nil && e.Code != "UNAUTHENTICATED" {
		c.render(w, r, e.status(), "error", page{Title: "Sign-out failed", Error: e})
		return
	}
	redirect(w, r, Prefix+"signin")
}
