package apikeys

import (
	"database/sql"
	"testing"
	"time"
)

func TestCredentialValid(t *testing.T) {
	none := sql.NullInt64{}
	at := func(ms int64) sql.NullInt64 { return sql.NullInt64{Int64: ms, Valid: true} }
	for _, tc := range []struct {
		name         string
		revoked, exp sql.NullInt64
		now          int64
		want         bool
	}{
		{"no expiry, unrevoked", none, none, 5, true},
		{"before its expiry", none, at(10), 9, true},
		{"at its expiry", none, at(10), 10, false},
		{"after its expiry", none, at(10), 11, false},
		{"revoked", at(1), none, 5, false},
		{"revoked before its expiry", at(1), at(10), 5, false},
	} {
		if got := credentialValid(tc.revoked, tc.exp, tc.now); got != tc.want {
			t.Errorf("%s: credentialValid = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestLimit(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	capped := Principal{ExpiresAt: now.Add(time.Hour)}
	for _, tc := range []struct {
		name   string
		caller Principal
		ttl    time.Duration
		want   time.Time
	}{
		{"no expiry asked by an unexpiring caller", Principal{}, 0, time.Time{}},
		{"a ttl", Principal{}, time.Minute, now.Add(time.Minute)},
		{"no expiry asked by an expiring caller", capped, 0, now.Add(time.Hour)},
		{"a ttl past the caller's expiry", capped, 2 * time.Hour, now.Add(time.Hour)},
		{"a ttl within it", capped, time.Minute, now.Add(time.Minute)},
	} {
		if got := Limit(tc.caller, now, tc.ttl); !got.Equal(tc.want) {
			t.Errorf("%s: Limit = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestMaker(t *testing.T) {
	if maker(Principal{KeyID: "k", SessionID: "ss"}) != "ss" || maker(Principal{KeyID: "k"}) != "k" || maker(Principal{}) != "" {
		t.Fatal("the maker is the session when there is one, else the key")
	}
}
