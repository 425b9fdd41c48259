package ops

import (
	"crypto/sha256"
	"encoding/hex"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"
)

// PortOps is the TCP port the op server listens on at the bastion's
// tunnel address.
const PortOps = 18400

// The op kinds. KindTerminal is not sent to POST /v1/op: it is the kind a
// terminal's approval is bound to (GET /v1/terminal).
const (
	KindObserveDisk  = "observe:disk"
	KindObserveNet   = "observe:net"
	KindObserveProcs = "observe:procs"
	KindFilesList    = "files:list"
	KindFilesStat    = "files:stat"
	KindFilesRead    = "files:read"
	KindFilesMove    = "files:move-plan"
	KindDryRun       = "action:dry-run"
	KindApply        = "action:apply"
	KindRootRun      = "root:run"
	KindTerminal     = "terminal"
)

// Shape limits of the args (b19-wire.md).
const (
	MaxBody      = 256 << 10 // a POST /v1/op body
	MaxPath      = 4096      // a path inside a share
	MaxMoves     = 100       // moves in one plan
	MaxScript    = 64 << 10  // an action's script
	MaxEffects   = 32        // an action's declared effects
	MaxInputs    = 8         // an action's inputs
	MaxURL       = 2048      // an input's URL
	MaxInputName = 255       // an input's file name
	MaxArgv      = 64        // root:run argv entries
	MaxHost      = 253       // observe:net host
)

// EmptyArgs are the args of observe:disk and observe:procs: {}.
type EmptyArgs struct{}

// ObserveNetArgs are observe:net's args.
type ObserveNetArgs struct {
	Host string `json:"host"`
	Port int    `json:"port"`
}

// FilesArgs are files:list, files:stat and files:read's args.
type FilesArgs struct {
	Share string `json:"share"`
	Path  string `json:"path"`
}

// Move is one move of a plan; To "" archives From.
type Move struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// MovePlanArgs are files:move-plan's args.
type MovePlanArgs struct {
	Share string `json:"share"`
	Moves []Move `json:"moves"`
}

// Input is a file an action fetches before its dry run.
type Input struct {
	URL string `json:"url"`
	As  string `json:"as"`
}

// DryRunArgs are action:dry-run's args: the terms the person approves.
type DryRunArgs struct {
	Share   string   `json:"share"`
	Script  string   `json:"script"`
	Effects []string `json:"effects"`
	Inputs  []Input  `json:"inputs"`
}

// ApplyArgs are action:apply's args.
type ApplyArgs struct {
	Plan   string `json:"plan"`
	Digest string `json:"digest"`
}

// RootRunArgs are root:run's args.
type RootRunArgs struct {
	Argv []string `json:"argv"`
}

// TerminalArgs are what a terminal's approval is bound to.
type TerminalArgs struct {
	Session string `json:"session"`
	Root    bool   `json:"root"`
}

// Digest is the hex SHA-256 of kind, a NUL and the canonical args: what an
// approval is bound to (the same as the approval package's Digest).
func Digest(kind string, canonical []byte) string {
	h := sha256.New()
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write(canonical)
	return hex.EncodeToString(h.Sum(nil))
}

// kindSpec is what the decoder and the decision know of one kind.
type kindSpec struct {
	typ   reflect.Type
	write bool // needs an approval or a standing grant
	// check validates and normalises the args (a value of typ).
	check func(any) (any, error)
}

// kinds holds every kind; it is never written after init.
var kinds = map[string]kindSpec{
	KindObserveDisk:  spec(false, func(*EmptyArgs) string { return "" }),
	KindObserveProcs: spec(false, func(*EmptyArgs) string { return "" }),
	KindObserveNet:   spec(false, checkNet),
	KindFilesList:    spec(false, checkFiles),
	KindFilesStat:    spec(false, checkFiles),
	KindFilesRead:    spec(false, checkFiles),
	KindFilesMove:    spec(true, checkMoves),
	KindDryRun:       spec(true, checkDryRun),
	KindApply:        spec(true, checkApply),
	KindRootRun:      spec(false, checkRootRun),
	KindTerminal:     spec(true, checkTerminal),
}

// spec builds a kindSpec from a check that returns "" or what is wrong.
func spec[T any](write bool, f func(*T) string) kindSpec {
	return kindSpec{typ: reflect.TypeFor[T](), write: write, check: func(a any) (any, error) {
		t, ok := a.(T)
		if !ok {
			return nil, invalid(ReasonBadArgs, "args of another kind")
		}
		if why := f(&t); why != "" {
			return nil, invalid(ReasonBadArgs, why)
		}
		return t, nil
	}}
}

func checkNet(a *ObserveNetArgs) string {
	if a.Host == "" || len(a.Host) > MaxHost || strings.Trim(a.Host, hostChars) != "" {
		return "host: a name or address, 1 to 253 characters"
	}
	if a.Port < 1 || a.Port > 65535 {
		return "port: 1 to 65535"
	}
	return ""
}

const hostChars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:"

func checkFiles(a *FilesArgs) string {
	if !validID("sh_", 12, a.Share) {
		return "share: a share id"
	}
	if !validPath(a.Path, true) {
		return "path: at most 4096 bytes, no control characters"
	}
	return ""
}

func checkMoves(a *MovePlanArgs) string {
	if !validID("sh_", 12, a.Share) {
		return "share: a share id"
	}
	if len(a.Moves) < 1 || len(a.Moves) > MaxMoves {
		return "moves: 1 to 100"
	}
	for _, m := range a.Moves {
		if !validPath(m.From, false) || !validPath(m.To, true) {
			return "moves: paths of at most 4096 bytes, no control characters, from not empty"
		}
	}
	return ""
}

func checkDryRun(a *DryRunArgs) string {
	switch {
	case !validID("sh_", 12, a.Share):
		return "share: a share id"
	case a.Script == "" || len(a.Script) > MaxScript || strings.ContainsRune(a.Script, 0):
		return "script: 1 byte to 64 KiB, no NUL"
	case len(a.Effects) < 1 || len(a.Effects) > MaxEffects:
		return "effects: 1 to 32"
	case len(a.Inputs) > MaxInputs:
		return "inputs: at most 8"
	}
	for _, e := range a.Effects {
		if !validPath(e, false) {
			return "effects: paths of at most 4096 bytes, no control characters"
		}
	}
	for _, in := range a.Inputs {
		if in.URL == "" || len(in.URL) > MaxURL || hasControl(in.URL) || !validFileName(in.As) {
			return "inputs: a URL of at most 2048 bytes and a plain file name"
		}
	}
	if a.Inputs == nil {
		a.Inputs = []Input{}
	}
	return ""
}

func checkApply(a *ApplyArgs) string {
	if !validID("pl_", 20, a.Plan) {
		return "plan: a plan id"
	}
	if len(a.Digest) != 64 || strings.Trim(a.Digest, "0123456789abcdef") != "" {
		return "digest: 64 lowercase hex digits"
	}
	return ""
}

func checkRootRun(a *RootRunArgs) string {
	if len(a.Argv) < 1 || len(a.Argv) > MaxArgv {
		return "argv: 1 to 64 entries"
	}
	if !validPath(a.Argv[0], false) || !strings.HasPrefix(a.Argv[0], "/") {
		return "argv: the first entry an absolute path"
	}
	for _, s := range a.Argv {
		if len(s) > MaxPath || strings.ContainsRune(s, 0) {
			return "argv: entries of at most 4096 bytes, no NUL"
		}
	}
	return ""
}

func checkTerminal(a *TerminalArgs) string {
	if !validID("ts_", 20, a.Session) {
		return "session: a terminal session id"
	}
	return ""
}

// validID reports whether s is prefix and n lowercase base32 characters.
func validID(prefix string, n int, s string) bool {
	if len(s) != len(prefix)+n || !strings.HasPrefix(s, prefix) {
		return false
	}
	return strings.Trim(s[len(prefix):], "abcdefghijklmnopqrstuvwxyz234567") == ""
}

// validPath checks a path's shape only: length, UTF-8, no control
// characters; the share package checks what it means.
func validPath(p string, emptyOK bool) bool {
	if p == "" {
		return emptyOK
	}
	return len(p) <= MaxPath && utf8.ValidString(p) && !hasControl(p)
}

// validFileName is a plain file name: no separator, not "." or "..".
func validFileName(s string) bool {
	return s != "" && len(s) <= MaxInputName && s != "." && s != ".." &&
		!strings.ContainsAny(s, `/\`) && utf8.ValidString(s) && !hasControl(s)
}

// hasControl reports a control character (C0, DEL or C1).
func hasControl(s string) bool {
	for _, r := range s {
		if unicode.IsControl(r) {
			return true
		}
	}
	return false
}
