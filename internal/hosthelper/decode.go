package hosthelper

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

// knownOp reports whether op is an operation of the wire contract; any other op is refused
// CodeUnknownOp before dispatch.
func knownOp(op string) bool {
	switch op {
	case helperwire.OpPing, helperwire.OpFileWrite, helperwire.OpFileRemove,
		helperwire.OpFirewallApply, helperwire.OpGPUReset, helperwire.OpReboot,
		helperwire.OpSandboxCreate, helperwire.OpSandboxExec, helperwire.OpSandboxUpdate,
		helperwire.OpSandboxDelete, helperwire.OpSandboxCheckpoint, helperwire.OpSandboxLabels, helperwire.OpSandboxFailures, helperwire.OpSandboxAdopt, helperwire.OpSSHAccess, helperwire.OpEventsDrain:
		return true
	}
	return false
}

// Decode reads one request strictly. b must be exactly one JSON object,
// at most helperwire.MaxRequest bytes (else CodeTooLarge), optionally
// followed by one final newline and nothing else: leading whitespace, any
// other trailing byte (even whitespace), a key that is not exactly one of
// Request's names (encoding/json would otherwise match keys ignoring case),
// a key given twice, or a value of the wrong type is CodeMalformed. A
// version other than helperwire.Version is CodeVersion, an op outside the
// contract CodeUnknownOp.
func Decode(b []byte) (*helperwire.Request, *helperwire.Refusal) {
	if len(b) > helperwire.MaxRequest {
		return nil, refuse(helperwire.CodeTooLarge, "request over 4 MiB")
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	if len(b) == 0 || b[0] != '{' {
		return nil, refuse(helperwire.CodeMalformed, "request is not one JSON object")
	}
	if err := checkKeys(b); err != nil {
		return nil, refuse(helperwire.CodeMalformed, err.Error())
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var req helperwire.Request
	if err := dec.Decode(&req); err != nil {
		return nil, refuse(helperwire.CodeMalformed, "request does not decode")
	}
	if dec.InputOffset() != int64(len(b)) {
		return nil, refuse(helperwire.CodeMalformed, "trailing bytes after the request")
	}
	if req.Version != helperwire.Version {
		return nil, refuse(helperwire.CodeVersion, "only version 1 is spoken")
	}
	if !knownOp(req.Op) {
		return nil, refuse(helperwire.CodeUnknownOp, "unknown operation")
	}
	return &req, nil
}

// checkKeys walks the top-level object's keys: each must be exactly one of
// Request's JSON names, at most once.
func checkKeys(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil { // '{', checked by the caller
		return errors.New("request does not decode")
	}
	var seen [numRequestKeys]bool
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return errors.New("request does not decode")
		}
		k, _ := t.(string)
		i := keyIndex(k)
		if i < 0 {
			return errors.New("unknown field in request")
		}
		if seen[i] {
			return errors.New("field given twice in request")
		}
		seen[i] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return errors.New("request does not decode")
		}
	}
	if _, err := dec.Token(); err != nil && !errors.Is(err, io.EOF) {
		return errors.New("request does not decode")
	}
	return nil
}

// numRequestKeys is how many JSON names helperwire.Request has.
const numRequestKeys = 7

// keyIndex numbers Request's exact JSON names, -1 for any other key.
func keyIndex(k string) int {
	switch k {
	case "version":
		return 0
	case "op":
		return 1
	case "intent":
		return 2
	case "bundle":
		return 3
	case "command":
		return 4
	case "args":
		return 5
	case "env_values":
		return 6
	}
	return -1
}

// DecodeArgs decodes an operation's Args into v strictly (unknown fields
// and trailing bytes refused), answering CodeArgs on any failure; handlers
// use it so every operation's arguments are as strict as the request.
func DecodeArgs(raw json.RawMessage, v any) *helperwire.Refusal {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return refuse(helperwire.CodeArgs, "arguments do not decode")
	}
	if dec.InputOffset() != int64(len(raw)) {
		return refuse(helperwire.CodeArgs, "trailing bytes after the arguments")
	}
	return nil
}

func refuse(code, reason string) *helperwire.Refusal {
	return &helperwire.Refusal{Code: code, Reason: reason}
}
