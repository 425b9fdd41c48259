package hostops

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"github.com/bettercompute/bettercompute/internal/hosthelper/helperwire"
)

// Table is one nftables table: its family (ip, ip6, inet, arp, bridge,
// netdev) and name.
type Table struct {
	Family string
	Name   string
}

// DefaultOwned returns exactly the tables bcd makes: the sandbox egress
// firewall's (internal/daemon/sandbox, egress.go: table inet bcsandbox).
func DefaultOwned() []Table { return []Table{{Family: "inet", Name: "bcsandbox"}} }

// DefaultNFT is the nft binary ApplyRuleset runs: an absolute path, so
// no PATH decides which program root runs.
const DefaultNFT = "/usr/sbin/nft"

// MaxRuleset is the largest script CheckRuleset accepts.
const MaxRuleset = 1 << 20

// nft families, and the one a command without a family gets.
var families = []string{"ip", "ip6", "inet", "arp", "bridge", "netdev"}

const defaultFamily = "ip"

// The commands a statement may start with (verb optional), and the
// objects they may name; every one of those objects is named by a
// [family] table pair right after it.
var (
	verbs   = []string{"add", "create", "insert", "replace", "delete", "destroy", "flush"}
	objects = []string{"table", "chain", "rule", "set", "map", "element", "flowtable", "counter", "quota", "limit", "secmark", "synproxy"}
)

// forbidden words, refused anywhere outside strings and comments: they
// read other files, define variables or reach the whole ruleset.
var forbidden = []string{"include", "define", "redefine", "undefine", "ruleset"}

// token is one nft token: a word, a quoted string, or one of { } ; and
// "\n" (the statement separators and block bounds).
type token struct {
	text string
	line int
	str  bool // a quoted string (text without the quotes)
}

// tokenize splits script the way nft's scanner does for every script it
// returns: comments (# to the end of the line) dropped, "..." strings
// kept whole, { } ; and newlines as their own tokens, other runs of
// non-blank bytes as words. It refuses (CodeRuleset) what would make its
// reading and nft's differ: a control byte other than tab and newline,
// a byte outside ASCII outside a comment, a backslash, a single quote or
// a backquote, and a string that is unterminated or spans lines.
func tokenize(script string) ([]token, error) {
	var toks []token
	line := 1
	for i := 0; i < len(script); {
		c := script[i]
		switch {
		case c == '#':
			for i < len(script) && script[i] != '\n' {
				if b := script[i]; b < 0x20 && b != '\t' || b == 0x7f {
					return nil, refuse(helperwire.CodeRuleset, "line %d: control byte in a comment", line)
				}
				i++
			}
		case c == '\n':
			toks = append(toks, token{text: "\n", line: line})
			line++
			i++
		case c == ' ' || c == '\t':
			i++
		case c == '{' || c == '}' || c == ';':
			toks = append(toks, token{text: string(c), line: line})
			i++
		case c == '"':
			end := strings.IndexByte(script[i+1:], '"')
			if end < 0 || strings.ContainsAny(script[i+1:i+1+end], "\n\\") || hasControl(script[i+1:i+1+end]) {
				return nil, refuse(helperwire.CodeRuleset, "line %d: a string that is unterminated or holds a newline, backslash or control byte", line)
			}
			toks = append(toks, token{text: script[i+1 : i+1+end], line: line, str: true})
			i += end + 2
		default:
			j := i
			for j < len(script) && !strings.ContainsRune(" \t\n{};\"#", rune(script[j])) {
				if b := script[j]; b < 0x20 || b >= 0x7f || b == '\\' || b == '\'' || b == '`' {
					return nil, refuse(helperwire.CodeRuleset, "line %d: byte %#x is refused outside strings and comments", line, b)
				}
				j++
			}
			toks = append(toks, token{text: script[i:j], line: line})
			i = j
		}
	}
	return toks, nil
}

// hasControl reports a control byte (or DEL) in s.
func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return true
		}
	}
	return false
}

// identRuns splits a word into its runs of [A-Za-z0-9_], the pieces
// nft's scanner may read as keywords however the word is punctuated.
func identRuns(w string) []string {
	return strings.FieldsFunc(w, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_')
	})
}

// CheckRuleset refuses (CodeRuleset, with a reason naming the token and
// its line) a script that could reach beyond the owned tables: over
// MaxRuleset bytes; any include, define, redefine, undefine or ruleset
// (flush ruleset, list ruleset) anywhere; a variable ($x); a statement
// at the top level that is not [verb] object [family] table ... for an
// owned table (so no bare rule, list, monitor, reset, rename or ct
// command, and no table, chain, set, ... of another table or family); and
// the word table anywhere but as a statement's object. Blocks and the rest of a statement are
// otherwise free: inside an owned table, chains, sets, jumps and @set
// references resolve within that table.
func CheckRuleset(script string, owned []Table) error {
	if len(script) > MaxRuleset {
		return refuse(helperwire.CodeRuleset, "script of %d bytes is over %d", len(script), MaxRuleset)
	}
	toks, err := tokenize(script)
	if err != nil {
		return err
	}
	depth, start, object := 0, true, -1
	for i, t := range toks {
		sep := !t.str && (t.text == "\n" || t.text == ";")
		brace := !t.str && (t.text == "{" || t.text == "}")
		if depth == 0 && start && !sep {
			if t.str || brace {
				return refuse(helperwire.CodeRuleset, "line %d: a statement must start with a command, not %q", t.line, t.text)
			}
			off, err := checkStatement(toks[i:], owned)
			if err != nil {
				return err
			}
			object, start = i+off, false
		}
		if err := checkWord(t, i == object); err != nil {
			return err
		}
		switch {
		case sep:
			start = start || depth == 0
		case brace && t.text == "{":
			depth++
		case brace:
			if err := closeBlock(toks, i, &depth); err != nil {
				return err
			}
		}
	}
	if depth != 0 {
		return refuse(helperwire.CodeRuleset, "unclosed '{' at the end")
	}
	return nil
}

// closeBlock handles the '}' at toks[i]: refused without an open block,
// and when it closes a top-level statement it must end it (a separator
// or the end of the script next), so nothing after it escapes the head
// check.
func closeBlock(toks []token, i int, depth *int) error {
	t := toks[i]
	if *depth == 0 {
		return refuse(helperwire.CodeRuleset, "line %d: '}' without '{'", t.line)
	}
	*depth--
	if *depth == 0 && i+1 < len(toks) {
		if n := toks[i+1]; n.str || n.text != "\n" && n.text != ";" {
			return refuse(helperwire.CodeRuleset, "line %d: %q after a top-level block; end the statement first", n.line, n.text)
		}
	}
	return nil
}

// checkWord refuses a forbidden word, a variable, and the word table
// anywhere but as the object of a top-level statement (isObject).
func checkWord(t token, isObject bool) error {
	if t.str {
		return nil
	}
	if strings.ContainsRune(t.text, '$') {
		return refuse(helperwire.CodeRuleset, "line %d: variable %q", t.line, t.text)
	}
	for _, r := range identRuns(t.text) {
		if slices.Contains(forbidden, r) {
			return refuse(helperwire.CodeRuleset, "line %d: %q is refused", t.line, r)
		}
		if r == "table" && !isObject {
			return refuse(helperwire.CodeRuleset, "line %d: \"table\" only starts a statement", t.line)
		}
	}
	return nil
}

// checkStatement checks the head of a top-level statement: an optional
// verb, an object, an optional family (ip when absent) and a table name,
// all plain words, naming an owned table. It returns the object's index
// in toks.
func checkStatement(toks []token, owned []Table) (int, error) {
	words := make([]token, 0, 4)
	for _, t := range toks {
		if len(words) == 4 || t.str || strings.ContainsAny(t.text, "{};\n") {
			break
		}
		words = append(words, t)
	}
	line, object := toks[0].line, 0
	if len(words) > 0 && slices.Contains(verbs, words[0].text) {
		words, object = words[1:], 1
	}
	if len(words) == 0 || !slices.Contains(objects, words[0].text) {
		return 0, refuse(helperwire.CodeRuleset, "line %d: %q is not a command on a table", line, toks[0].text)
	}
	obj, words := words[0].text, words[1:]
	tb := Table{Family: defaultFamily}
	if len(words) > 0 && slices.Contains(families, words[0].text) {
		tb.Family, words = words[0].text, words[1:]
	}
	if len(words) == 0 {
		return 0, refuse(helperwire.CodeRuleset, "line %d: %s without a table name", line, obj)
	}
	tb.Name = words[0].text
	if !slices.Contains(owned, tb) {
		return 0, refuse(helperwire.CodeRuleset, "line %d: table %s %s is not one of bcd's", line, tb.Family, tb.Name)
	}
	return object, nil
}

// ApplyRuleset checks script against o.Owned (CheckRuleset), then loads
// it with nft -f - (the script on stdin, a fixed argv), which applies it
// as one transaction. A script nft refuses is CodeFailed, with nft's
// first output line as the reason.
func (o *Ops) ApplyRuleset(ctx context.Context, script string) error {
	owned := o.Owned
	if owned == nil {
		owned = DefaultOwned()
	}
	if err := CheckRuleset(script, owned); err != nil {
		return err
	}
	nft := o.NFT
	if nft == "" {
		nft = DefaultNFT
	}
	cmd := exec.CommandContext(ctx, nft, "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	cmd.Env = []string{}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		first, _, _ := strings.Cut(strings.TrimSpace(out.String()), "\n")
		return &helperwire.Refusal{Code: helperwire.CodeFailed, Reason: fmt.Sprintf("nft: %v: %.200s", err, first)}
	}
	return nil
}
