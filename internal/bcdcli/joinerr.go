package bcdcli

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// joinError turns a refused or failed join into a sentence that says what
// to do. The gateway answers every refused token alike (ACCESS_DENIED), so
// the sentence names every cause a token can have.
func joinError(gateway string, err error) error {
	if err == nil {
		return nil
	}
	var st interface{ GRPCStatus() *status.Status }
	code := codes.OK
	if errors.As(err, &st) {
		code = st.GRPCStatus().Code()
	}
	switch {
	case code == codes.PermissionDenied:
		return errors.New("the control plane refused the join token: it was already used, has expired, was revoked, or is unknown there (or the node name is not valid); make a new one with `better-compute join-tokens create` and run bcd join again")
	case code == codes.Unavailable:
		return fmt.Errorf("cannot reach the gateway at %s: is `better-compute serve` (with the gateway role) or `better-compute dev` running, and is --gateway its gateway address (host:port)? (%w)", gateway, err)
	case code == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("the gateway at %s did not answer in time: check that it is reachable from this machine, then run bcd join again (%w)", gateway, err)
	}
	return err
}
