package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/bettercompute/bettercompute/internal/daemon/driver"
)

// Serve is the plugin's side of the protocol: it writes the handshake
// (name and d's inventory), then answers each request on in with d's Run,
// one at a time, until in ends (bcd closed it) or ctx is done. A request
// that does not decode ends Serve with an error, as bcd never sends one;
// a result that is not JSON is answered as the error "result-invalid".
func Serve(ctx context.Context, name string, d driver.Driver, in io.Reader, out io.Writer) error {
	hs, err := EncodeHandshake(name, d.Inventory())
	if err != nil {
		return err
	}
	if _, err := out.Write(hs); err != nil {
		return fmt.Errorf("write handshake: %w", err)
	}
	lr := NewLineReader(in)
	for ctx.Err() == nil {
		line, err := lr.ReadLine(MaxMessage, CodeMessageTooLarge)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		req, err := DecodeRequest(line)
		if err != nil {
			return err
		}
		resp := answer(ctx, d, req)
		b, err := EncodeMessage(resp)
		if err != nil {
			b, _ = EncodeMessage(errorResponse(req.ID, "result-too-large"))
		}
		if _, err := out.Write(b); err != nil {
			return fmt.Errorf("write response: %w", err)
		}
	}
	return ctx.Err()
}

func answer(ctx context.Context, d driver.Driver, req Request) Response {
	res, err := d.Run(ctx, req.Kind, req.Payload)
	if err != nil {
		return errorResponse(req.ID, err.Error())
	}
	if len(res) == 0 || !json.Valid(res) {
		return errorResponse(req.ID, "result-invalid")
	}
	return Response{ID: req.ID, Result: res}
}

func errorResponse(id uint64, msg string) Response {
	return Response{ID: id, Error: &msg}
}
