package jsontime

import (
	"encoding/json"
	"testing"
	"time"
)

// TestNormalize: every *_at member that is a time gets Layout in UTC,
// whatever precision and zone encoding/json gave it; everything else,
// strings inside values included, is left as it is.
func TestNormalize(t *testing.T) {
	zone := time.FixedZone("x", 2*3600)
	v := map[string]any{
		"created_at": time.Date(2026, 12, 1, 18, 12, 42, 0, time.UTC),
		"expires_at": time.Date(2026, 12, 1, 20, 12, 42, 120_000_000, zone),
		"list": []any{map[string]any{
			"last_seen_at": time.Date(2026, 12, 1, 18, 12, 42, 123_456_789, time.UTC),
			"name":         `"sneaky_at": "2026-12-01T18:12:42Z"`,
		}},
		"note_at":  "not a time",
		"started":  time.Date(2026, 12, 1, 18, 12, 42, 0, time.UTC),
		"empty_at": nil,
		"labels":   map[string]string{"build_at": "2026-12-01T18:12:42Z"},
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(Normalize(b), &got); err != nil {
		t.Fatalf("%v: %s", err, Normalize(b))
	}
	want := map[string]string{
		"created_at": "2026-12-01T18:12:42.000Z",
		"expires_at": "2026-12-01T18:12:42.120Z",
		"note_at":    "not a time",
		"started":    "2026-12-01T18:12:42Z", // not named *_at: as encoding/json wrote it
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %v, want %s", k, got[k], w)
		}
	}
	item := got["list"].([]any)[0].(map[string]any)
	if item["last_seen_at"] != "2026-12-01T18:12:42.123Z" || item["name"] != `"sneaky_at": "2026-12-01T18:12:42Z"` {
		t.Errorf("list item: %v", item)
	}
	if got["labels"].(map[string]any)["build_at"] != "2026-12-01T18:12:42.000Z" {
		t.Errorf("labels: %v", got["labels"])
	}
	same := []byte("{\n  \"created_at\": \"2026-12-01T18:12:42.000Z\"\n}")
	if out := Normalize(same); &out[0] != &same[0] {
		t.Error("an already normal answer was copied")
	}
}
