package helperwire

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Client calls the root helper over its Unix socket: one request per
// connection, as the contract says.
type Client struct {
	// Socket is the helper's socket path.
	Socket string
}

// Call sends req (Version is filled in when zero) and returns the result of
// a done operation. A refused or failed operation is a *Refusal error
// carrying the helper's code. ctx bounds the whole call: its deadline is
// the connection's, and cancelling it aborts the call.
func (c *Client) Call(ctx context.Context, req *Request) (json.RawMessage, error) {
	r := *req
	if r.Version == 0 {
		r.Version = Version
	}
	body, err := json.Marshal(&r)
	if err != nil {
		return nil, fmt.Errorf("helper call: encode: %w", err)
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.Socket)
	if err != nil {
		return nil, fmt.Errorf("helper call: dial: %w", err)
	}
	defer conn.Close()
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return nil, errors.New("helper call: not a unix connection")
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = uc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = uc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	_, werr := uc.Write(body)
	if werr == nil {
		werr = uc.CloseWrite()
	}
	// Read even after a failed write: a helper that refused early (a
	// caller check, an oversized request) has answered and closed.
	resp, rerr := readResponse(uc)
	if rerr != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("helper call: %w", cerr)
		}
		return nil, errors.Join(rerr, wrapNonNil("helper call: write", werr))
	}
	if resp.Code != "" {
		return nil, &Refusal{Code: resp.Code, Reason: resp.Reason}
	}
	return resp.Result, nil
}

func wrapNonNil(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// readResponse reads at most MaxResponse bytes and decodes them strictly:
// one object, no unknown field, nothing after it, the version spoken.
func readResponse(c net.Conn) (*Response, error) {
	b, err := io.ReadAll(io.LimitReader(c, MaxResponse+1))
	if err != nil {
		return nil, fmt.Errorf("helper call: read: %w", err)
	}
	if len(b) > MaxResponse {
		return nil, errors.New("helper call: response over 16 MiB")
	}
	return DecodeResponse(b)
}

// DecodeResponse decodes a helper response strictly: exactly one JSON
// object with only Response's fields, nothing after it, and Version.
func DecodeResponse(b []byte) (*Response, error) {
	if len(b) == 0 {
		return nil, errors.New("helper call: empty response (the helper closed without answering)")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var resp Response
	if err := dec.Decode(&resp); err != nil {
		return nil, fmt.Errorf("helper call: decode response: %w", err)
	}
	if dec.InputOffset() != int64(len(b)) {
		return nil, errors.New("helper call: trailing bytes after the response")
	}
	if resp.Version != Version {
		return nil, fmt.Errorf("helper call: response version %d, want %d", resp.Version, Version)
	}
	return &resp, nil
}
