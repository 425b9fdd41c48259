package ops

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"unicode/utf8"
)

// Op is one decoded, validated op.
type Op struct {
	// ID is the control plane's op id ("op_" + 26 base32); for a terminal,
	// the session id.
	ID string
	// Kind is one of the Kind constants.
	Kind string
	// Args is the kind's args struct (a value, e.g. FilesArgs).
	Args any
	// Canonical is json.Marshal(Args): the bytes the approval digest is
	// taken of.
	Canonical []byte
	// Approval is the approval request id ("apr_" + 20 base32) or "".
	Approval string
}

// envelope is the POST /v1/op body.
type envelope struct {
	OpID     string          `json:"op_id"`
	Kind     string          `json:"kind"`
	Args     json.RawMessage `json:"args"`
	Approval string          `json:"approval"`
}

// Decode decodes and validates one POST /v1/op body strictly: at most
// MaxBody bytes of valid UTF-8 holding one JSON object whose keys (also
// inside args) are exactly the listed ones, each at most once, with no null
// value and nothing after it; an op_id "op_" + 26 base32; a known kind
// (terminal is not one here); args matching the kind's schema; an approval
// "" or "apr_" + 20 base32. Every error is a *RefusedError with
// CodeInvalidInput.
func Decode(body []byte) (Op, error) {
	if len(body) > MaxBody {
		return Op{}, invalid(ReasonBodyTooLarge, "the body is over 256 KiB")
	}
	if !utf8.Valid(body) {
		return Op{}, invalid(ReasonMalformed, "the body is not UTF-8")
	}
	var env envelope
	if err := strictDecode(body, &env); err != nil {
		return Op{}, invalid(ReasonMalformed, err.Error())
	}
	if !validID("op_", 26, env.OpID) {
		return Op{}, invalid(ReasonMalformed, "op_id: op_ and 26 base32 characters")
	}
	if env.Approval != "" && !validID("apr_", 20, env.Approval) {
		return Op{}, invalid(ReasonMalformed, "approval: apr_ and 20 base32 characters")
	}
	sp, ok := kinds[env.Kind]
	if !ok || env.Kind == KindTerminal {
		return Op{}, invalid(ReasonUnknownKind, "kind: not a kind this bastion knows")
	}
	if env.Args == nil {
		return Op{}, invalid(ReasonBadArgs, "args: missing")
	}
	ptr := reflect.New(sp.typ)
	if err := strictDecode(env.Args, ptr.Interface()); err != nil {
		return Op{}, invalid(ReasonBadArgs, err.Error())
	}
	return newOp(env.OpID, env.Kind, ptr.Elem().Interface(), env.Approval)
}

// newOp validates args for kind and fills Canonical.
func newOp(id, kind string, args any, approval string) (Op, error) {
	sp, ok := kinds[kind]
	if !ok {
		return Op{}, invalid(ReasonUnknownKind, "kind: not a kind this bastion knows")
	}
	args, err := sp.check(args)
	if err != nil {
		return Op{}, err
	}
	canonical, err := json.Marshal(args)
	if err != nil {
		return Op{}, invalid(ReasonBadArgs, "args cannot be encoded")
	}
	return Op{ID: id, Kind: kind, Args: args, Canonical: canonical, Approval: approval}, nil
}

// strictDecode checks data's keys against v's type (see walk), then
// decodes it with unknown fields refused.
func strictDecode(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := walk(dec, reflect.TypeOf(v).Elem()); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the object")
	}
	dec = json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errors.New("a value of the wrong type")
	}
	return nil
}

var rawType = reflect.TypeFor[json.RawMessage]()

// walk reads one JSON value from dec and checks it against t: an object
// only where t is a struct, with exactly t's json keys (case as spelled),
// each at most once; an array only where t is a slice; never null. A
// json.RawMessage field takes any value but null (checked later).
func walk(dec *json.Decoder, t reflect.Type) error {
	tok, err := dec.Token()
	if err != nil {
		return errors.New("not JSON")
	}
	if tok == nil {
		return errors.New("a null value")
	}
	if t == rawType {
		return skip(dec, tok)
	}
	switch tok {
	case json.Delim('{'):
		if t.Kind() != reflect.Struct {
			return errors.New("an object where none belongs")
		}
		return walkObject(dec, t)
	case json.Delim('['):
		if t.Kind() != reflect.Slice {
			return errors.New("an array where none belongs")
		}
		for dec.More() {
			if err := walk(dec, t.Elem()); err != nil {
				return err
			}
		}
		_, err = dec.Token()
		return err
	}
	if t.Kind() == reflect.Struct || t.Kind() == reflect.Slice {
		return errors.New("a scalar where an object or array belongs")
	}
	return nil
}

// walkObject checks an object's members after its '{'.
func walkObject(dec *json.Decoder, t reflect.Type) error {
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		fields[f.Tag.Get("json")] = f.Type
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return errors.New("not JSON")
		}
		key, _ := tok.(string)
		ft, ok := fields[key]
		switch {
		case !ok:
			return errors.New("an unknown field")
		case seen[key]:
			return errors.New("a repeated field")
		}
		seen[key] = true
		if err := walk(dec, ft); err != nil {
			return err
		}
	}
	_, err := dec.Token()
	return err
}

// skip reads the rest of a value whose first token is tok.
func skip(dec *json.Decoder, tok json.Token) error {
	depth := 0
	for {
		if d, ok := tok.(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
			} else {
				depth--
			}
		}
		if depth == 0 {
			return nil
		}
		var err error
		if tok, err = dec.Token(); err != nil {
			return errors.New("not JSON")
		}
	}
}
