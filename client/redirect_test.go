package client_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/bettercompute/bettercompute/client"
)

// The client never follows a redirect: a 30x from the API (or from
// whoever answers in its place) does not carry the API key anywhere.
func TestClientDoesNotFollowRedirects(t *testing.T) {
	var leaked bool
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leaked = r.Header.Get("Authorization") != ""
	}))
	defer target.Close()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusTemporaryRedirect)
	}))
	defer api.Close()
	c := client.New(api.URL, "bc_k_secret")
	if _, err := c.Nodes(context.Background()); err == nil {
		t.Fatal("a redirect answered as a success")
	}
	if leaked {
		t.Fatal("the client followed the redirect with its API key")
	}
}
