package api

import (
	"bytes"
	"encoding"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/bettercompute/bettercompute/internal/jsonstrict"
	"io"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/iam"
	"github.com/bettercompute/bettercompute/internal/sandboxes"
	"github.com/bettercompute/bettercompute/internal/sandboxes/spec"
)

// Input limits. Every field of a method's input carries its bounds in an
// `api` struct tag (or, for a type defined in another package, in
// foreignLimits), and Decode refuses a value outside them before the
// handler runs, as INVALID_INPUT naming the field's JSON path and the
// bound:
//
//	max=N     a string (or base64 []byte) of at most N bytes; in a slice or
//	          map, each element or value
//	keymax=N  each key of a map, at most N bytes
//	items=N   a slice or map of at most N entries
//	min=A     a number of at least A (with max=B: at most B)
//
// A field without a bound gets the fallback (strings 256 bytes, 256
// entries, numbers 0 to 2^31-1); TestInputsAreBounded proves no method's
// input relies on it.
const (
	fallbackMaxString = 256
	fallbackMaxItems  = 256
	fallbackMax       = math.MaxInt32
)

// bounds are the parsed limits of one field.
type bounds struct {
	max, keyMax, items int64
	min                int64
	hasMax, hasKeyMax  bool
	hasItems, hasMin   bool
}

func parseBounds(tag string) (bounds, error) {
	var b bounds
	if tag == "" {
		return b, nil
	}
	for _, part := range strings.Split(tag, ",") {
		k, v, ok := strings.Cut(part, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil {
			return b, fmt.Errorf("api: bad limit %q", part)
		}
		switch k {
		case "max":
			b.max, b.hasMax = n, true
		case "keymax":
			b.keyMax, b.hasKeyMax = n, true
		case "items":
			b.items, b.hasItems = n, true
		case "min":
			b.min, b.hasMin = n, true
		default:
			return b, fmt.Errorf("api: bad limit %q", part)
		}
	}
	return b, nil
}

// foreignLimits are the `api` tags of input fields whose struct is defined
// in another package, by type and JSON name.
func foreignLimits(t reflect.Type, name string) string {
	var m map[string]string
	switch t {
	case reflect.TypeFor[iam.Statement]():
		m = map[string]string{"effect": "max=8", "actions": "items=64,max=128", "resources": "items=64,max=256"}
	case reflect.TypeFor[sandboxes.TemplateIn]():
		m = map[string]string{"name": "max=63", "image": "max=128", "runtime": "max=16", "network": "max=16",
			"lifetime_seconds": "min=0,max=604800", "max_lifetime_seconds": "min=0,max=604800",
			"env": "items=256,keymax=256,max=16384", "labels": "items=64,keymax=63,max=63", "warm": fmt.Sprintf("min=0,max=%d", sandboxes.MaxWarm)}
	case reflect.TypeFor[spec.Limits]():
		m = map[string]string{"cpu_millis": "min=0,max=64000", "memory_mb": "min=0,max=262144", "pids": "min=0,max=32768", "disk_mb": "min=0,max=65536"}
	}
	return m[name]
}

// field is one JSON member of a struct.
type field struct {
	index  []int
	typ    reflect.Type
	limits string
	opaque bool // json.RawMessage and the like: bounded only by the body
}

// fieldsOf returns t's JSON members by exact name, flattening embedded
// structs as encoding/json does.
func fieldsOf(t reflect.Type) map[string]field {
	out := map[string]field{}
	var walk func(t reflect.Type, index []int)
	walk = func(t reflect.Type, index []int) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			tag := f.Tag.Get("json")
			name, _, _ := strings.Cut(tag, ",")
			if name == "-" && tag == "-" {
				continue
			}
			idx := append(append([]int{}, index...), i)
			ft := f.Type
			if f.Anonymous && name == "" {
				et := ft
				if et.Kind() == reflect.Pointer {
					et = et.Elem()
				}
				if et.Kind() == reflect.Struct {
					walk(et, idx)
					continue
				}
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			limits, ok := f.Tag.Lookup("api")
			if !ok {
				limits = foreignLimits(t, name)
			}
			out[name] = field{index: idx, typ: ft, limits: limits, opaque: isOpaque(ft)}
		}
	}
	walk(t, nil)
	return out
}

var (
	rawMessageType      = reflect.TypeFor[json.RawMessage]()
	jsonUnmarshalerType = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

func isOpaque(t reflect.Type) bool {
	if t == rawMessageType {
		return true
	}
	pt := reflect.PointerTo(t)
	return t.Implements(jsonUnmarshalerType) || pt.Implements(jsonUnmarshalerType) || t.Implements(textUnmarshalerType) || pt.Implements(textUnmarshalerType)
}

func isBytes(t reflect.Type) bool {
	return t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8
}

// Decode strictly decodes a JSON object into v: bytes that are not UTF-8
// (which Go's decoder would turn into U+FFFD unseen), duplicate keys,
// unknown fields (names match exactly, never case-insensitively), wrong
// types, values outside a field's limits and trailing data are
// INVALID_INPUT naming the field by its JSON path.
func Decode(raw []byte, v any) error {
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' {
		return errs.New(errs.InvalidInput, "the body must be a JSON object")
	}
	if err := jsonstrict.Check(raw, "body"); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var tree any
	if err := dec.Decode(&tree); err != nil {
		return errs.New(errs.InvalidInput, "the body is not valid JSON")
	}
	if _, err := dec.Token(); err != io.EOF {
		return errs.New(errs.InvalidInput, "trailing data after the JSON object")
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Pointer || rv.IsNil() {
		return errors.New("api: Decode needs a pointer")
	}
	if err := checkValue(tree, rv.Type().Elem(), "", bounds{}); err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		// checkValue accepts only what decodes; this is a bug, not input.
		return fmt.Errorf("api: decode checked input: %w", err)
	}
	return nil
}

func invalid(path, msg string) error {
	return errs.New(errs.InvalidInput, fmt.Sprintf("field %q: %s", path, msg))
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

// checkValue checks the decoded JSON value v against Go type t with the
// bounds b of the field it fills, at path.
func checkValue(v any, t reflect.Type, path string, b bounds) error {
	if v == nil {
		return nil // null leaves the field as it is
	}
	if isOpaque(t) {
		return nil
	}
	switch t.Kind() {
	case reflect.Pointer:
		return checkValue(v, t.Elem(), path, b)
	case reflect.Interface:
		return nil
	case reflect.Struct:
		return checkStruct(v, t, path)
	case reflect.String:
		s, ok := v.(string)
		if !ok {
			return wrongType(path)
		}
		return checkLen(path, s, b)
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			return wrongType(path)
		}
		return nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return checkInteger(v, t, path, b)
	case reflect.Float32, reflect.Float64:
		if _, ok := v.(json.Number); !ok {
			return wrongType(path)
		}
		return nil
	case reflect.Slice, reflect.Array:
		return checkList(v, t, path, b)
	case reflect.Map:
		return checkMap(v, t, path, b)
	}
	return wrongType(path)
}

func wrongType(path string) error { return invalid(path, "wrong type") }

// checkStruct checks a JSON object against struct t: every member must be
// one of t's fields (by exact name), within that field's bounds.
func checkStruct(v any, t reflect.Type, path string) error {
	obj, ok := v.(map[string]any)
	if !ok {
		return wrongType(path)
	}
	fields := fieldsOf(t)
	for _, k := range sortedKeys(obj) {
		f, ok := fields[k]
		if !ok {
			if path == "" {
				return errs.New(errs.InvalidInput, fmt.Sprintf("unknown field %q", k))
			}
			return errs.New(errs.InvalidInput, fmt.Sprintf("unknown field %q", join(path, k)))
		}
		fb, err := parseBounds(f.limits)
		if err != nil {
			return err
		}
		if err := checkValue(obj[k], f.typ, join(path, k), fb); err != nil {
			return err
		}
	}
	return nil
}

// checkInteger checks a JSON number against integer type t and b's range.
func checkInteger(v any, t reflect.Type, path string, b bounds) error {
	n, ok := v.(json.Number)
	if !ok {
		return wrongType(path)
	}
	lo, hi := numberRange(t, b)
	i, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil || i < lo || i > hi {
		return invalid(path, fmt.Sprintf("an integer from %d to %d", lo, hi))
	}
	return nil
}

// checkList checks a JSON array (or, for []byte, a base64 string) against
// slice or array type t: at most b's items, each element within b.
func checkList(v any, t reflect.Type, path string, b bounds) error {
	if isBytes(t) {
		s, ok := v.(string)
		if !ok {
			return wrongType(path)
		}
		if err := checkLen(path, s, b); err != nil {
			return err
		}
		// What encoding/json accepts for []byte: standard base64, padded
		// (it skips CR and LF, as DecodeString does).
		if _, err := base64.StdEncoding.DecodeString(s); err != nil {
			return invalid(path, "not base64 (standard alphabet, padded)")
		}
		return nil
	}
	arr, ok := v.([]any)
	if !ok {
		return wrongType(path)
	}
	if items := itemsOf(b); int64(len(arr)) > items {
		return invalid(path, fmt.Sprintf("at most %d entries", items))
	}
	eb := elementBounds(b)
	for i, e := range arr {
		if err := checkValue(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i), eb); err != nil {
			return err
		}
	}
	return nil
}

// checkMap checks a JSON object against map type t (string keys): at most
// b's items, keys of at most b's keymax, each value within b.
func checkMap(v any, t reflect.Type, path string, b bounds) error {
	obj, ok := v.(map[string]any)
	if !ok || t.Key().Kind() != reflect.String {
		return wrongType(path)
	}
	if items := itemsOf(b); int64(len(obj)) > items {
		return invalid(path, fmt.Sprintf("at most %d entries", items))
	}
	keyMax := int64(fallbackMaxString)
	if b.hasKeyMax {
		keyMax = b.keyMax
	}
	eb := elementBounds(b)
	for _, k := range sortedKeys(obj) {
		if int64(len(k)) > keyMax {
			return invalid(path, fmt.Sprintf("keys of at most %d bytes", keyMax))
		}
		if err := checkValue(obj[k], t.Elem(), join(path, k), eb); err != nil {
			return err
		}
	}
	return nil
}

// elementBounds are the bounds of each element of a list or map with
// bounds b: its max and min, not its item count or key bound.
func elementBounds(b bounds) bounds {
	return bounds{max: b.max, hasMax: b.hasMax, min: b.min, hasMin: b.hasMin}
}

func checkLen(path, s string, b bounds) error {
	max := int64(fallbackMaxString)
	if b.hasMax {
		max = b.max
	}
	if int64(len(s)) > max {
		return invalid(path, fmt.Sprintf("at most %d bytes", max))
	}
	return nil
}

func itemsOf(b bounds) int64 {
	if b.hasItems {
		return b.items
	}
	return fallbackMaxItems
}

// numberRange is the accepted range of an integer field: its bounds, else
// the fallback, within what t holds.
func numberRange(t reflect.Type, b bounds) (lo, hi int64) {
	lo, hi = 0, fallbackMax
	if b.hasMin {
		lo = b.min
	}
	if b.hasMax {
		hi = b.max
	}
	var tlo, thi int64
	switch t.Kind() {
	case reflect.Int8:
		tlo, thi = math.MinInt8, math.MaxInt8
	case reflect.Int16:
		tlo, thi = math.MinInt16, math.MaxInt16
	case reflect.Int32:
		tlo, thi = math.MinInt32, math.MaxInt32
	case reflect.Int, reflect.Int64:
		tlo, thi = math.MinInt64, math.MaxInt64
	case reflect.Uint8:
		tlo, thi = 0, math.MaxUint8
	case reflect.Uint16:
		tlo, thi = 0, math.MaxUint16
	case reflect.Uint32:
		tlo, thi = 0, math.MaxUint32
	default: // uint, uint64, uintptr
		tlo, thi = 0, math.MaxInt64
	}
	return max(lo, tlo), min(hi, thi)
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// LimitProblems lists every field reachable from input type t whose
// bounds are missing (a string or base64 field without max, a slice or
// map without items, a number without min and max) or malformed.
func LimitProblems(t reflect.Type) []string {
	var out []string
	seen := map[reflect.Type]bool{}
	var walk func(t reflect.Type, path string, b bounds, tag string)
	walk = func(t reflect.Type, path string, b bounds, tag string) {
		if isOpaque(t) {
			return
		}
		switch t.Kind() {
		case reflect.Pointer:
			walk(t.Elem(), path, b, tag)
		case reflect.Struct:
			if seen[t] {
				return
			}
			seen[t] = true
			for name, f := range fieldsOf(t) {
				fb, err := parseBounds(f.limits)
				if err != nil {
					out = append(out, join(path, name)+": "+err.Error())
					continue
				}
				walk(f.typ, join(path, name), fb, f.limits)
			}
			delete(seen, t)
		case reflect.String:
			if !b.hasMax {
				out = append(out, path+": string without max")
			}
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			if !b.hasMin || !b.hasMax {
				out = append(out, path+": number without min and max")
			}
		case reflect.Slice, reflect.Array, reflect.Map:
			if isBytes(t) {
				if !b.hasMax {
					out = append(out, path+": base64 bytes without max")
				}
				return
			}
			if !b.hasItems {
				out = append(out, path+": "+t.Kind().String()+" without items")
			}
			if t.Kind() == reflect.Map && !b.hasKeyMax {
				out = append(out, path+": map without keymax")
			}
			walk(t.Elem(), path+"[]", bounds{max: b.max, hasMax: b.hasMax, min: b.min, hasMin: b.hasMin}, tag)
		}
	}
	walk(t, "", bounds{}, "")
	slices.Sort(out)
	return out
}

// NumberBound is one integer field of an input type: its JSON path (each
// element a member name) and its accepted range.
type NumberBound struct {
	Path     []string
	Min, Max int64
}

// NumberBounds lists the integer fields reachable from input type t
// through structs (not through slices or maps), with their ranges.
func NumberBounds(t reflect.Type) []NumberBound {
	var out []NumberBound
	var walk func(t reflect.Type, path []string, b bounds)
	walk = func(t reflect.Type, path []string, b bounds) {
		if isOpaque(t) {
			return
		}
		switch t.Kind() {
		case reflect.Pointer:
			walk(t.Elem(), path, b)
		case reflect.Struct:
			for name, f := range fieldsOf(t) {
				fb, _ := parseBounds(f.limits)
				walk(f.typ, append(slices.Clip(path), name), fb)
			}
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			lo, hi := numberRange(t, b)
			out = append(out, NumberBound{Path: path, Min: lo, Max: hi})
		}
	}
	walk(t, nil, bounds{})
	slices.SortFunc(out, func(a, b NumberBound) int { return slices.Compare(a.Path, b.Path) })
	return out
}
