package cli

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/bettercompute/bettercompute/internal/clisafe"
)

// TestMCPStreamKeepsEveryRune: the MCP stream an agent reads carries a
// string with DEL and a C1 control unchanged in meaning (escaped, not
// dropped as the terminal filter would), and no raw DEL or C1 byte
// reaches the output.
func TestMCPStreamKeepsEveryRune(t *testing.T) {
	want := "a\u007fb\u0085c\u009bd"
	msg, err := json.Marshal(map[string]string{"text": want})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	w := jsonStream{clisafe.Raw(&clisafe.Writer{W: &out})}
	if n, err := w.Write(append(msg, '\n')); err != nil || n != len(msg)+1 {
		t.Fatalf("write: %d, %v", n, err)
	}
	if bytes.ContainsAny(out.Bytes(), "\u007f\u0085\u009b") {
		t.Fatalf("a raw DEL or C1 control reached the stream: %q", out.String())
	}
	var got map[string]string
	if err := json.Unmarshal(out.Bytes(), &got); err != nil || got["text"] != want {
		t.Fatalf("the agent reads %q (%v), want %q", got["text"], err, want)
	}
}
