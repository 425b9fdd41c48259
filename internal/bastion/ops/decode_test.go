package ops

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

var (
	tOp    = testID("op_", 26, 1)
	tApr   = testID("apr_", 20, 1)
	tPlan  = testID("pl_", 20, 1)
	tShare = testID("sh_", 12, 1)
)

// body builds a POST /v1/op body with raw args.
func body(kind, args string) string {
	return `{"op_id":"` + tOp + `","kind":"` + kind + `","args":` + args + `}`
}

// goodBodies holds one valid body per kind.
func goodBodies() map[string]string {
	return map[string]string{
		KindObserveDisk:  body(KindObserveDisk, `{}`),
		KindObserveProcs: body(KindObserveProcs, `{}`),
		KindObserveNet:   body(KindObserveNet, `{"host":"example.com","port":443}`),
		KindFilesList:    body(KindFilesList, `{"share":"`+tShare+`","path":""}`),
		KindFilesStat:    body(KindFilesStat, `{"share":"`+tShare+`","path":"a/b.txt"}`),
		KindFilesRead:    body(KindFilesRead, `{"share":"`+tShare+`","path":"a/b.txt"}`),
		KindFilesMove:    body(KindFilesMove, `{"share":"`+tShare+`","moves":[{"from":"a","to":""},{"from":"b","to":"c/d"}]}`),
		KindDryRun: body(KindDryRun, `{"share":"`+tShare+`","script":"echo hi > out","effects":["out"],`+
			`"inputs":[{"url":"https://example.com/x.tgz","as":"x.tgz"}]}`),
		KindApply:   `{"op_id":"` + tOp + `","kind":"action:apply","approval":"` + tApr + `","args":{"plan":"` + tPlan + `","digest":"` + strings.Repeat("ab", 32) + `"}}`,
		KindRootRun: body(KindRootRun, `{"argv":["/usr/bin/systemctl","restart","ollama"]}`),
	}
}

func TestDecodeEveryKind(t *testing.T) {
	for kind, b := range goodBodies() {
		op, err := Decode([]byte(b))
		if err != nil {
			t.Errorf("%s: %v", kind, err)
			continue
		}
		if op.Kind != kind || op.ID != tOp || !bytes.HasPrefix(op.Canonical, []byte("{")) {
			t.Errorf("%s: decoded %+v", kind, op)
		}
	}
}

// Equivalent bodies (spacing, key order, inputs absent or empty) give the
// same canonical args, so an approval asked once binds the repeat.
func TestDecodeCanonical(t *testing.T) {
	a, err := Decode([]byte(body(KindDryRun, `{"share":"`+tShare+`","script":"s","effects":["o"]}`)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Decode([]byte(" {\"kind\":\"action:dry-run\", \"args\": {\"inputs\": [], \"effects\":[\"o\"],\"script\":\"s\",\"share\":\"" +
		tShare + "\"}, \"op_id\":\"" + tOp + "\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"share":"` + tShare + `","script":"s","effects":["o"],"inputs":[]}`
	if string(a.Canonical) != want || string(b.Canonical) != want {
		t.Fatalf("canonical %s and %s, want %s", a.Canonical, b.Canonical, want)
	}
}

func TestDecodeRefusals(t *testing.T) {
	files := func(path string) string { return body(KindFilesRead, `{"share":"`+tShare+`","path":"`+path+`"}`) }
	for _, tc := range []struct{ name, body, reason string }{
		{"empty", ``, ReasonMalformed},
		{"not an object", `[]`, ReasonMalformed},
		{"two objects", body(KindObserveDisk, `{}`) + `{}`, ReasonMalformed},
		{"trailing garbage", body(KindObserveDisk, `{}`) + `x`, ReasonMalformed},
		{"unknown field", `{"op_id":"` + tOp + `","kind":"observe:disk","args":{},"extra":1}`, ReasonMalformed},
		{"key in another case", `{"op_id":"` + tOp + `","Kind":"observe:disk","args":{}}`, ReasonMalformed},
		{"repeated key", `{"op_id":"` + tOp + `","kind":"root:run","kind":"observe:disk","args":{}}`, ReasonMalformed},
		{"null op_id", `{"op_id":null,"kind":"observe:disk","args":{}}`, ReasonMalformed},
		{"bad op_id", body(KindObserveDisk, `{}`)[:12] + "X" + body(KindObserveDisk, `{}`)[13:], ReasonMalformed},
		{"upper-case op_id", strings.Replace(body(KindObserveDisk, `{}`), tOp, strings.ToUpper(tOp), 1), ReasonMalformed},
		{"bad approval", `{"op_id":"` + tOp + `","kind":"observe:disk","args":{},"approval":"apr_1"}`, ReasonMalformed},
		{"invalid UTF-8", body(KindObserveDisk, `{}`)[:len(body(KindObserveDisk, `{}`))-1] + "\xff}", ReasonMalformed},
		{"too large", body(KindObserveDisk, `{}`) + strings.Repeat(" ", MaxBody), ReasonBodyTooLarge},
		{"unknown kind", body("observe:k8s", `{}`), ReasonUnknownKind},
		{"terminal is not an op", body(KindTerminal, `{"session":"`+testID("ts_", 20, 1)+`","root":false}`), ReasonUnknownKind},
		{"shell", body("shell", `{"cmd":"id"}`), ReasonUnknownKind},
		{"args missing", `{"op_id":"` + tOp + `","kind":"observe:disk"}`, ReasonBadArgs},
		{"args null", body(KindObserveDisk, `null`), ReasonMalformed},
		{"args not an object", body(KindObserveDisk, `[]`), ReasonBadArgs},
		{"args unknown field", body(KindObserveDisk, `{"x":1}`), ReasonBadArgs},
		{"unknown field in a move", body(KindFilesMove, `{"share":"`+tShare+`","moves":[{"from":"a","to":"","mode":"delete"}]}`), ReasonBadArgs},
		{"repeated arg", body(KindObserveNet, `{"host":"a","host":"b","port":1}`), ReasonBadArgs},
		{"port zero", body(KindObserveNet, `{"host":"example.com","port":0}`), ReasonBadArgs},
		{"port too big", body(KindObserveNet, `{"host":"example.com","port":65536}`), ReasonBadArgs},
		{"port as string", body(KindObserveNet, `{"host":"example.com","port":"443"}`), ReasonBadArgs},
		{"host with a space", body(KindObserveNet, `{"host":"a b","port":1}`), ReasonBadArgs},
		{"bad share", body(KindFilesRead, `{"share":"sh_x","path":""}`), ReasonBadArgs},
		{"path with NUL", files(`a\u0000b`), ReasonBadArgs},
		{"path with escape", files(`a\u001b[2J`), ReasonBadArgs},
		{"path with C1 control", files(`a\u0085b`), ReasonBadArgs},
		{"path too long", files(strings.Repeat("a", MaxPath+1)), ReasonBadArgs},
		{"no moves", body(KindFilesMove, `{"share":"`+tShare+`","moves":[]}`), ReasonBadArgs},
		{"too many moves", body(KindFilesMove, `{"share":"`+tShare+`","moves":[`+strings.Repeat(`{"from":"a"},`, MaxMoves)+`{"from":"a"}]}`), ReasonBadArgs},
		{"move from empty", body(KindFilesMove, `{"share":"`+tShare+`","moves":[{"from":"","to":"b"}]}`), ReasonBadArgs},
		{"empty script", body(KindDryRun, `{"share":"`+tShare+`","script":"","effects":["o"]}`), ReasonBadArgs},
		{"no effects", body(KindDryRun, `{"share":"`+tShare+`","script":"s","effects":[]}`), ReasonBadArgs},
		{"input as a path", body(KindDryRun, `{"share":"`+tShare+`","script":"s","effects":["o"],"inputs":[{"url":"https://x","as":"../x"}]}`), ReasonBadArgs},
		{"null in effects", body(KindDryRun, `{"share":"`+tShare+`","script":"s","effects":[null]}`), ReasonBadArgs},
		{"bad plan", body(KindApply, `{"plan":"pl_x","digest":"`+strings.Repeat("a", 64)+`"}`), ReasonBadArgs},
		{"upper-case digest", body(KindApply, `{"plan":"`+tPlan+`","digest":"`+strings.Repeat("A", 64)+`"}`), ReasonBadArgs},
		{"relative argv", body(KindRootRun, `{"argv":["sh","-c","id"]}`), ReasonBadArgs},
		{"empty argv", body(KindRootRun, `{"argv":[]}`), ReasonBadArgs},
		{"argv as string", body(KindRootRun, `{"argv":"/bin/id"}`), ReasonBadArgs},
	} {
		_, err := Decode([]byte(tc.body))
		var re *RefusedError
		if !errors.As(err, &re) || re.Code != CodeInvalidInput || re.Reason != tc.reason {
			t.Errorf("%s: err = %v, want INVALID_INPUT %s", tc.name, err, tc.reason)
		}
	}
}
