package api

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/bettercompute/bettercompute/internal/api/apitypes"
	"github.com/bettercompute/bettercompute/internal/commands"
	"github.com/bettercompute/bettercompute/internal/commands/wire"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/nodes"
	"github.com/bettercompute/bettercompute/internal/quorum"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
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

// Each answer the client reads through apitypes is a module's type on the
// server: every field of the wire type is a field of the module's type
// with the same JSON name and a type that encodes the same way, so the
// client decodes what the server sends.
func TestWireViewsMatchModules(t *testing.T) {
	pairs := []struct{ wire, module reflect.Type }{
		{reflect.TypeFor[apitypes.Node](), reflect.TypeFor[nodes.Node]()},
		{reflect.TypeFor[apitypes.JoinToken](), reflect.TypeFor[nodes.CreatedToken]()},
		{reflect.TypeFor[apitypes.Command](), reflect.TypeFor[commands.Command]()},
		{reflect.TypeFor[apitypes.Attestation](), reflect.TypeFor[commands.Attestation]()},
		{reflect.TypeFor[apitypes.Tenant](), reflect.TypeFor[iam.Tenant]()},
		{reflect.TypeFor[apitypes.Identity](), reflect.TypeFor[iam.Identity]()},
		{reflect.TypeFor[apitypes.Binding](), reflect.TypeFor[iam.Binding]()},
		{reflect.TypeFor[apitypes.Batch](), reflect.TypeFor[quorum.Batch]()},
		{reflect.TypeFor[apitypes.ApproverSet](), reflect.TypeFor[quorum.ApproverSetView]()},
		{reflect.TypeFor[apitypes.ApproverSetStatus](), reflect.TypeFor[quorum.SetChangeStatus]()},
		{reflect.TypeFor[apitypes.Image](), reflect.TypeFor[sandboxes.Image]()},
		{reflect.TypeFor[apitypes.Sandbox](), reflect.TypeFor[sandboxes.Sandbox]()},
		{reflect.TypeFor[apitypes.ExecResult](), reflect.TypeFor[sandboxes.ExecResult]()},
		{reflect.TypeFor[apitypes.QuotaLimits](), reflect.TypeFor[quota.Limits]()},
	}
	for _, p := range pairs {
		for _, problem := range wireProblems(p.wire, p.module, p.wire.Name()) {
			t.Errorf("apitypes.%s vs %s: %s", p.wire.Name(), p.module, problem)
		}
	}
}

// wireProblems lists where wire's JSON does not match module's, at path.
func wireProblems(wire, module reflect.Type, path string) []string {
	timeType := reflect.TypeFor[time.Time]()
	switch {
	case wire == rawMessageType || wire == module:
		return nil
	case wire.Kind() == reflect.Pointer && module.Kind() == reflect.Pointer:
		return wireProblems(wire.Elem(), module.Elem(), path)
	case wire == timeType || module == timeType:
		return []string{path + ": " + wire.String() + " against " + module.String()}
	case wire.Kind() == reflect.Struct && module.Kind() == reflect.Struct:
		var out []string
		mf := fieldsOf(module)
		for name, f := range fieldsOf(wire) {
			g, ok := mf[name]
			if !ok {
				out = append(out, path+"."+name+": not in the module's type")
				continue
			}
			out = append(out, wireProblems(f.typ, g.typ, path+"."+name)...)
		}
		return out
	case isBytes(wire) || isBytes(module):
		// []byte encodes as a base64 string.
		if (isBytes(wire) || wire.Kind() == reflect.String) && (isBytes(module) || module.Kind() == reflect.String) {
			return nil
		}
	case wire.Kind() == reflect.Slice && module.Kind() == reflect.Slice,
		wire.Kind() == reflect.Map && module.Kind() == reflect.Map:
		return wireProblems(wire.Elem(), module.Elem(), path+"[]")
	case wire.Kind() == module.Kind() && wire.Kind() != reflect.Interface:
		return nil // a named string or number type encodes as its kind
	}
	return []string{path + ": " + wire.String() + " against " + module.String()}
}

// The client's Command.Terminal agrees with the command module's state
// vocabulary.
func TestWireCommandTerminal(t *testing.T) {
	for _, s := range []wire.State{wire.StateQueued, wire.StateSent, wire.StateRunning, wire.StateSucceeded, wire.StateFailed, wire.StateCancelled} {
		if (apitypes.Command{State: string(s)}).Terminal() != s.Terminal() {
			t.Errorf("state %s: client Terminal %v, module %v", s, !s.Terminal(), s.Terminal())
		}
	}
}
