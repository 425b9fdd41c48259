package action

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Limits on a program, checked when it arrives.
const (
	// MaxScriptBytes is the longest script.
	MaxScriptBytes = 64 << 10
	// MaxEffects is the most effects a program declares (at least one).
	MaxEffects = 32
	// MaxInputs is the most inputs a program names.
	MaxInputs = 8
	// MaxInputBytes is the largest body an input may have.
	MaxInputBytes = 16 << 20
	// MaxEffectBytes is the largest an effect may be, before or after.
	MaxEffectBytes = 16 << 20
	// maxPathBytes bounds an effect path, maxURLBytes an input URL.
	maxPathBytes = 1024
	maxURLBytes  = 2048
	// checkTimeout bounds the this-machine lookups Check makes.
	checkTimeout = 5 * time.Second
)

// Input is a file fetched before the dry run and mounted read-only at
// /inputs/<As>.
type Input struct {
	// URL is an http or https URL with a host.
	URL string `json:"url"`
	// As is a plain file name.
	As string `json:"as"`
}

// Program is an action op's program: the script, the files it may change
// (paths relative to the shared folder) and what it fetches.
type Program struct {
	// Script is /bin/sh text, run with /work (the effects' copies) as its
	// working directory.
	Script string `json:"script"`
	// Effects are the files the program may change or create.
	Effects []string `json:"effects"`
	// Inputs are fetched before the run.
	Inputs []Input `json:"inputs"`
}

// Check judges a program when it arrives: the script is 1..MaxScriptBytes
// bytes; 1..MaxEffects effects, each a clean relative path (see
// ReasonBadEffect); 0..MaxInputs inputs, each an http(s) URL with a host
// and a plain file name; a host written as an address, or named localhost,
// is refused with ReasonDestinationPrivate as the package comment says
// (a name is judged at fetch and at apply).
func (r *Runner) Check(p Program) error {
	if p.Script == "" || len(p.Script) > MaxScriptBytes {
		return refuse(ReasonBadScript, fmt.Sprintf("the script must be 1 to %d bytes", MaxScriptBytes))
	}
	if err := checkEffects(p.Effects); err != nil {
		return err
	}
	if len(p.Inputs) > MaxInputs {
		return refuse(ReasonBadInput, fmt.Sprintf("at most %d inputs", MaxInputs))
	}
	names := make(map[string]bool, len(p.Inputs))
	for i, in := range p.Inputs {
		if !plainName(in.As) || names[in.As] {
			return refuse(ReasonBadInput, fmt.Sprintf("input %d: \"as\" must be a plain file name, once", i))
		}
		names[in.As] = true
		host, err := inputHost(in.URL)
		if err != nil {
			return refuse(ReasonBadInput, fmt.Sprintf("input %d: %v", i, err))
		}
		if err := r.checkLiteral(host); err != nil {
			return err
		}
	}
	return nil
}

// checkLiteral refuses a host that is an address this machine may not
// reach, or a localhost name; other names pass (judged when resolved).
func (r *Runner) checkLiteral(host string) error {
	if isLocalhostName(host) {
		return refuse(ReasonDestinationPrivate, host+" (localhost-name)")
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	if why := r.guard.judge(ctx, a); why.Refused() {
		return refuse(ReasonDestinationPrivate, host+" ("+why.String()+")")
	}
	return nil
}

// checkEffects checks the effect list (see ReasonBadEffect).
func checkEffects(effects []string) error {
	if len(effects) == 0 || len(effects) > MaxEffects {
		return refuse(ReasonBadEffect, fmt.Sprintf("1 to %d effects", MaxEffects))
	}
	seen := make(map[string]bool, len(effects))
	for i, e := range effects {
		if !cleanPath(e) {
			return refuse(ReasonBadEffect, fmt.Sprintf("effect %d is not a clean relative path", i))
		}
		if seen[e] {
			return refuse(ReasonBadEffect, fmt.Sprintf("effect %d is declared twice", i))
		}
		seen[e] = true
	}
	for _, e := range effects {
		for d := path.Dir(e); d != "."; d = path.Dir(d) {
			if seen[d] {
				return refuse(ReasonBadEffect, strconv.Quote(e)+" is inside another effect")
			}
		}
	}
	return nil
}

// cleanPath reports whether p is a clean, local, slash-separated relative
// path of printable UTF-8 with no ".agent" folder in it.
func cleanPath(p string) bool {
	if p == "" || len(p) > maxPathBytes || !utf8.ValidString(p) || strings.ContainsRune(p, '\\') {
		return false
	}
	if path.Clean(p) != p || path.IsAbs(p) || !filepath.IsLocal(p) {
		return false
	}
	for _, c := range p {
		if unicode.IsControl(c) || !unicode.IsPrint(c) && c != ' ' {
			return false
		}
	}
	for part := range strings.SplitSeq(p, "/") {
		if part == ".agent" || part == "." || part == ".." {
			return false
		}
	}
	return true
}

// plainName reports whether s is a file name with no folder in it.
func plainName(s string) bool {
	return s != "" && len(s) <= 255 && !strings.ContainsRune(s, '/') && cleanPath(s)
}

// inputHost parses an input URL and returns its host, lower-cased, IPv6
// without brackets. The URL must be http or https, with a valid host, an
// optional port 1..65535, and no user information.
func inputHost(raw string) (string, error) {
	if raw == "" || len(raw) > maxURLBytes {
		return "", fmt.Errorf("the URL must be 1 to %d bytes", maxURLBytes)
	}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" || (u.Scheme != "http" && u.Scheme != "https") {
		return "", fmt.Errorf("the URL must be http or https")
	}
	if u.User != nil {
		return "", fmt.Errorf("the URL must not carry credentials")
	}
	host := strings.ToLower(u.Hostname())
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("the URL's port is not 1 to 65535")
		}
	} else if strings.HasSuffix(u.Host, ":") {
		return "", fmt.Errorf("the URL's port is empty")
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return "", fmt.Errorf("the URL's host must not name a zone")
		}
		return a.String(), nil
	}
	if !validHostName(host) {
		return "", fmt.Errorf("the URL's host is not a valid host name")
	}
	return host, nil
}

// validHostName accepts lower-case ASCII letters, digits, '-' and '_' in
// labels of 1 to 63 bytes, 253 bytes in all, one trailing dot allowed, the
// last label starting with a letter.
func validHostName(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	// The last label starts with a letter, as every top-level domain does:
	// "127.1" or "0x7f.1" is an address some resolvers accept, never a name.
	if last := h[strings.LastIndexByte(h, '.')+1:]; last == "" || last[0] < 'a' || last[0] > 'z' {
		return false
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// isLocalhostName reports whether h is "localhost" or under ".localhost".
func isLocalhostName(h string) bool {
	n := strings.ToLower(strings.TrimSuffix(h, "."))
	return n == "localhost" || strings.HasSuffix(n, ".localhost")
}
