package api

import (
	"bytes"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/bettercompute/bettercompute/internal/auditlog"
	"github.com/bettercompute/bettercompute/internal/bastions"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/quota"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
)

// everyMethod is the method table the API server registers (the optional
// modules present), as cmd/actiondoc reads it for docs/iam.md, sorted by
// name. No handler runs: the modules are empty.
func everyMethod() []Method {
	ms := append(Methods(Modules{Sandboxes: &sandboxes.Service{}, Quotas: &quota.Service{}, Bastions: &bastions.Service{}}), BatchMethods(BatchModules{})...)
	ms = append(ms, AuditMethods(&auditlog.Log{})...)
	slices.SortFunc(ms, func(a, b Method) int { return strings.Compare(a.Name, b.Name) })
	return ms
}

// exampleBody is a JSON body for input type t with every member set (one
// entry in each list and map), so the fuzzer starts from each method's
// field names.
func exampleBody(t reflect.Type) []byte {
	v := reflect.New(t).Elem()
	fill(v, 0)
	b, _ := json.Marshal(v.Interface())
	return b
}

func fill(v reflect.Value, depth int) {
	if depth > 6 || !v.CanSet() || isOpaque(v.Type()) {
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), depth+1)
	case reflect.Struct:
		for i := range v.NumField() {
			fill(v.Field(i), depth+1)
		}
	case reflect.String:
		v.SetString("x1")
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 1, 1)
		fill(s.Index(0), depth+1)
		v.Set(s)
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String {
			return
		}
		m := reflect.MakeMap(v.Type())
		e := reflect.New(v.Type().Elem()).Elem()
		fill(e, depth+1)
		m.SetMapIndex(reflect.ValueOf("k").Convert(v.Type().Key()), e)
		v.Set(m)
	}
}

// FuzzMethodBodies decodes arbitrary bodies for every method of the API's
// method table (the method picked by number) with the envelope's strict
// decoder, as a call's body is decoded before the handler runs. No body
// panics (the decoder or the method's target); a refusal is always
// INVALID_INPUT, never an internal error; and what an accepted body says,
// re-encoded from the decoded value (the members the body named), decodes
// for the same method to the same value and target.
func FuzzMethodBodies(f *testing.F) {
	ms := everyMethod()
	for i, m := range ms {
		f.Add(uint16(i), exampleBody(m.Input()))
		f.Add(uint16(i), []byte(`{}`))
	}
	f.Add(uint16(0), []byte(`{"tenant_id":"a","tenant_id":"b"}`))
	f.Add(uint16(1), []byte(`{"ID":"x"}`))
	f.Add(uint16(2), []byte(`{"id":"x"} {}`))
	f.Fuzz(func(t *testing.T, pick uint16, raw []byte) {
		m := ms[int(pick)%len(ms)]
		in, target, err := m.decode(raw)
		if err != nil {
			if errs.CodeOf(err) != errs.InvalidInput {
				t.Fatalf("%s: refused %q with %v, not INVALID_INPUT", m.Name, raw, err)
			}
			return
		}
		if reflect.TypeOf(in) != m.Input() {
			t.Fatalf("%s: decoded a %T, the method takes %v", m.Name, in, m.Input())
		}
		enc, err := said(raw, in)
		if err != nil {
			t.Fatalf("%s: accepted %q does not re-encode: %v", m.Name, raw, err)
		}
		again, target2, err := m.decode(enc)
		if err != nil {
			t.Fatalf("%s: accepted %q, refused its re-encoding %q: %v", m.Name, raw, enc, err)
		}
		if !reflect.DeepEqual(in, again) || target != target2 {
			t.Fatalf("%s: %q decoded to %+v (%+v), its re-encoding %q to %+v (%+v)", m.Name, raw, in, target, enc, again, target2)
		}
	})
}

// said re-encodes v, decoded from the JSON object raw, keeping only the
// members raw named (not null): an absent member decodes to its zero
// value, which its bounds need not admit, so only what the body said is
// written out again.
func said(raw []byte, v any) ([]byte, error) {
	full, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var orig, enc any
	if err := json.Unmarshal(raw, &orig); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(full))
	dec.UseNumber() // numbers as written: an int64 is not a float64
	if err := dec.Decode(&enc); err != nil {
		return nil, err
	}
	return json.Marshal(prune(enc, orig))
}

// prune keeps, in the objects of enc, the members that orig's matching
// objects hold with a value other than null.
func prune(enc, orig any) any {
	switch o := orig.(type) {
	case map[string]any:
		e, ok := enc.(map[string]any)
		if !ok {
			return enc
		}
		out := map[string]any{}
		for k, ov := range o {
			if ev, ok := e[k]; ok && ov != nil {
				out[k] = prune(ev, ov)
			}
		}
		return out
	case []any:
		e, ok := enc.([]any)
		if !ok || len(e) != len(o) {
			return enc
		}
		out := make([]any, len(e))
		for i := range e {
			out[i] = prune(e[i], o[i])
		}
		return out
	}
	return enc
}
