package api

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/quota"
)

// The wire types' bounds that restate a module's are the module's: every
// quota override is bounded by quota.MaxLimit, as it was when the input
// was quota.Overrides itself.
func TestWireBoundsMatchModules(t *testing.T) {
	want := fmt.Sprintf("min=0,max=%d", int64(quota.MaxLimit))
	typ := reflect.TypeFor[apitypes.QuotaOverrides]()
	for i := range typ.NumField() {
		if f := typ.Field(i); f.Tag.Get("api") != want {
			t.Errorf("QuotaOverrides.%s: api tag %q, want %q", f.Name, f.Tag.Get("api"), want)
		}
	}
}
