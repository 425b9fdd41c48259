// Package tunnelwire is the framing of a tunnel between a client and the
// API after the HTTP upgrade (GET /api/v1/tunnels/connect): a sequence of
// frames, each a type byte, a big-endian uint32 length and that many bytes.
// Frames rather than raw bytes, so that the end of a tunnel says why it
// ended (the node disconnected, the caller's access was revoked, the
// tunnel's 12 hours ran out) instead of looking like an orderly close, and
// so that the same stream can carry a terminal's size and a process's exit
// code for an interactive sandbox shell.
//
// Why our own: the frames are four kinds of a few bytes each; a WebSocket
// library would bring masking, fragmentation and a handshake of its own
// for nothing this needs, and HTTP/2 streams are not available on a
// hijacked HTTP/1.1 connection.
package tunnelwire

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Protocol is the Upgrade token of the tunnel endpoint.
const Protocol = "bc-tunnel-v1"

// Type is a frame's type.
type Type byte

// The frame types.
const (
	// Data carries bytes of the stream, at most MaxData.
	Data Type = 1
	// EOF says the sender sends no more data; the other way goes on.
	EOF Type = 2
	// Error ends the tunnel with a coded reason (an Error, JSON).
	Error Type = 3
	// Resize is a terminal's new size (client to node, for an exec with a
	// PTY): columns and rows, two big-endian uint16.
	Resize Type = 4
	// Exit is an exec's exit status (node to client), a big-endian int32;
	// the stream ends after it.
	Exit Type = 5
)

// Bounds of a frame's payload.
const (
	// MaxData bounds a data frame (the node protocol's bound too,
	// nodev1.MaxTunnelData).
	MaxData = 32 << 10
	// MaxError bounds an error frame's JSON.
	MaxError = 1 << 10
)

// Refusal is an error frame's payload: an API error code and a safe
// message, as the API's error answers carry.
type Refusal struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (r *Refusal) Error() string { return r.Code + ": " + r.Message }

// ErrFrame is returned (wrapped) for bytes that are not a valid frame.
var ErrFrame = errors.New("tunnelwire: malformed frame")

// Frame is one decoded frame.
type Frame struct {
	Type    Type
	Payload []byte
}

// maxPayload is the bound of t's payload, or -1 for an unknown type.
func maxPayload(t Type) int {
	switch t {
	case Data:
		return MaxData
	case EOF:
		return 0
	case Error:
		return MaxError
	case Resize, Exit:
		return 4
	}
	return -1
}

// Reader reads frames.
type Reader struct {
	r   *bufio.Reader
	buf []byte
}

// NewReader reads frames from r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReaderSize(r, MaxData+5)} }

// Next reads the next frame. Its payload is valid until the next call.
// A frame of an unknown type, over its type's bound, or an error frame
// that is not a Refusal is ErrFrame; a stream that ends between frames is
// io.EOF, and one that ends inside a frame io.ErrUnexpectedEOF.
func (r *Reader) Next() (Frame, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r.r, hdr[:1]); err != nil {
		return Frame{}, err
	}
	if _, err := io.ReadFull(r.r, hdr[1:]); err != nil {
		return Frame{}, unexpected(err)
	}
	t := Type(hdr[0])
	n := binary.BigEndian.Uint32(hdr[1:])
	limit := maxPayload(t)
	if limit < 0 {
		return Frame{}, fmt.Errorf("%w: unknown type %d", ErrFrame, t)
	}
	if n > uint32(limit) {
		return Frame{}, fmt.Errorf("%w: %d bytes for type %d", ErrFrame, n, t)
	}
	if cap(r.buf) < int(n) {
		r.buf = make([]byte, n, max(int(n), 4096))
	}
	p := r.buf[:n]
	if _, err := io.ReadFull(r.r, p); err != nil {
		return Frame{}, unexpected(err)
	}
	switch t {
	case Error:
		if _, err := DecodeRefusal(p); err != nil {
			return Frame{}, err
		}
	case Resize, Exit:
		if n != 4 {
			return Frame{}, fmt.Errorf("%w: %d bytes for type %d, want 4", ErrFrame, n, t)
		}
	}
	return Frame{Type: t, Payload: p}, nil
}

func unexpected(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// DecodeRefusal decodes an error frame's payload: exactly a Refusal with
// a non-empty code.
func DecodeRefusal(p []byte) (*Refusal, error) {
	var ref Refusal
	if err := json.Unmarshal(p, &ref); err != nil || ref.Code == "" {
		return nil, fmt.Errorf("%w: error frame is not a refusal", ErrFrame)
	}
	return &ref, nil
}

// Append appends one frame of type t with payload p to b; a data payload
// over MaxData is split into several frames. It panics on a payload over
// an EOF's or error's bound (a programming error).
func Append(b []byte, t Type, p []byte) []byte {
	for {
		chunk := p
		if limit := maxPayload(t); len(chunk) > limit {
			if t != Data {
				panic("tunnelwire: payload over the frame's bound")
			}
			chunk = p[:limit]
		}
		b = append(b, byte(t), 0, 0, 0, 0)
		binary.BigEndian.PutUint32(b[len(b)-4:], uint32(len(chunk)))
		b = append(b, chunk...)
		p = p[len(chunk):]
		if len(p) == 0 {
			return b
		}
	}
}

// RefusalFrame is an error frame for code and a safe message (cut to fit
// MaxError).
func RefusalFrame(code, msg string) []byte {
	for {
		p, _ := json.Marshal(Refusal{Code: code, Message: msg})
		if len(p) <= MaxError {
			return Append(nil, Error, p)
		}
		msg = msg[:len(msg)/2]
	}
}

// ResizeFrame is a Resize frame for cols by rows.
func ResizeFrame(cols, rows uint16) []byte {
	return Append(nil, Resize, []byte{byte(cols >> 8), byte(cols), byte(rows >> 8), byte(rows)})
}

// DecodeResize reads a Resize frame's payload.
func DecodeResize(p []byte) (cols, rows uint16) {
	return binary.BigEndian.Uint16(p), binary.BigEndian.Uint16(p[2:])
}

// ExitFrame is an Exit frame for code.
func ExitFrame(code int32) []byte {
	return Append(nil, Exit, binary.BigEndian.AppendUint32(nil, uint32(code)))
}

// DecodeExit reads an Exit frame's payload.
func DecodeExit(p []byte) int32 { return int32(binary.BigEndian.Uint32(p)) }
