package plugin

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/bettercompute/bettercompute/internal/proto/nodev1"
)

// Protocol is the one protocol version spoken; a handshake naming any
// other is refused.
const Protocol = "bcx-driver/1"

// Line bounds, in bytes, without the newline. A plugin whose handshake or
// message is longer is refused and killed, so it cannot make bcd buffer
// without bound.
const (
	MaxHandshake = 64 << 10
	MaxMessage   = 16 << 20
)

// MaxErrorText bounds the error text bcd keeps from a plugin's response.
const MaxErrorText = 4096

// Handshake is the first line a plugin writes: the protocol, its name and
// its inventory (protojson of nodev1.Inventory).
type Handshake struct {
	Protocol  string          `json:"protocol"`
	Name      string          `json:"name"`
	Inventory json.RawMessage `json:"inventory"`
}

// Request is one call from bcd: a command kind and its JSON payload.
type Request struct {
	ID      uint64          `json:"id"`
	Kind    string          `json:"kind"`
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Response answers the request with the same id: exactly one of Result
// (JSON) and Error.
type Response struct {
	ID     uint64          `json:"id"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *string         `json:"error,omitempty"`
}

// decodeStrict decodes exactly one JSON value into v, refusing unknown
// fields and trailing data.
func decodeStrict(line []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the message")
	}
	return nil
}

// DecodeHandshake decodes a handshake line strictly and returns the name
// and inventory it carries; a line over MaxHandshake, another protocol, an
// empty name or an inventory that is not a valid nodev1.Inventory is
// refused with CodeHandshakeTooLarge or CodeHandshakeInvalid.
func DecodeHandshake(line []byte) (string, *nodev1.Inventory, error) {
	if len(line) > MaxHandshake {
		return "", nil, refuse(CodeHandshakeTooLarge, nil)
	}
	var h Handshake
	if err := decodeStrict(line, &h); err != nil {
		return "", nil, refuse(CodeHandshakeInvalid, err)
	}
	if h.Protocol != Protocol {
		return "", nil, refuse(CodeHandshakeInvalid, errors.New("unknown protocol"))
	}
	if !ValidName(h.Name) {
		return "", nil, refuse(CodeHandshakeInvalid, errors.New("invalid name"))
	}
	inv := &nodev1.Inventory{}
	if len(h.Inventory) == 0 {
		return "", nil, refuse(CodeHandshakeInvalid, errors.New("no inventory"))
	}
	if err := protojson.Unmarshal(h.Inventory, inv); err != nil {
		return "", nil, refuse(CodeHandshakeInvalid, fmt.Errorf("inventory: %w", err))
	}
	return h.Name, inv, nil
}

// EncodeHandshake returns the handshake line (with its newline) for name
// and inv.
func EncodeHandshake(name string, inv *nodev1.Inventory) ([]byte, error) {
	raw, err := protojson.Marshal(inv)
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	return encodeLine(Handshake{Protocol: Protocol, Name: name, Inventory: raw}, MaxHandshake, CodeHandshakeTooLarge)
}

// DecodeRequest decodes a request line strictly: a non-zero id, a
// non-empty kind and, when present, a JSON payload.
func DecodeRequest(line []byte) (Request, error) {
	if len(line) > MaxMessage {
		return Request{}, refuse(CodeMessageTooLarge, nil)
	}
	var r Request
	if err := decodeStrict(line, &r); err != nil {
		return Request{}, refuse(CodeMessageInvalid, err)
	}
	if r.ID == 0 || r.Kind == "" {
		return Request{}, refuse(CodeMessageInvalid, errors.New("request needs an id and a kind"))
	}
	return r, nil
}

// DecodeResponse decodes a response line strictly: a non-zero id and
// exactly one of result and error.
func DecodeResponse(line []byte) (Response, error) {
	if len(line) > MaxMessage {
		return Response{}, refuse(CodeMessageTooLarge, nil)
	}
	var r Response
	if err := decodeStrict(line, &r); err != nil {
		return Response{}, refuse(CodeMessageInvalid, err)
	}
	hasResult := len(r.Result) > 0 && !bytes.Equal(r.Result, []byte("null"))
	if r.ID == 0 || hasResult == (r.Error != nil) {
		return Response{}, refuse(CodeMessageInvalid, errors.New("response needs an id and exactly one of result and error"))
	}
	return r, nil
}

// EncodeMessage returns v as one line (with its newline), refused with
// CodeMessageTooLarge over MaxMessage.
func EncodeMessage(v any) ([]byte, error) {
	return encodeLine(v, MaxMessage, CodeMessageTooLarge)
}

func encodeLine(v any, limit int, code string) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	if len(b) > limit {
		return nil, refuse(code, nil)
	}
	return append(b, '\n'), nil
}

// LineReader reads newline-terminated lines, each under a bound given per
// call, without ever holding more than the bound plus one buffer.
type LineReader struct{ r *bufio.Reader }

// NewLineReader reads lines from r.
func NewLineReader(r io.Reader) *LineReader {
	return &LineReader{r: bufio.NewReaderSize(r, 64<<10)}
}

// ReadLine returns the next line without its newline. A line longer than
// limit is refused with tooLarge as soon as the limit is passed; an end of
// input inside a line is io.ErrUnexpectedEOF, at a line boundary io.EOF.
func (l *LineReader) ReadLine(limit int, tooLarge string) ([]byte, error) {
	var line []byte
	for {
		chunk, err := l.r.ReadSlice('\n')
		n := len(chunk)
		if err == nil {
			n-- // the newline
		}
		if len(line)+n > limit {
			return nil, refuse(tooLarge, nil)
		}
		line = append(line, chunk[:n]...)
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) == 0:
			return nil, io.EOF
		case errors.Is(err, io.EOF):
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, fmt.Errorf("read: %w", err)
		}
	}
}
