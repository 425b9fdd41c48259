package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"github.com/spf13/cobra"
)

// explain rewrites an error that says only what failed into one that says
// what to do: the API cannot be reached, or something timed out (naming
// the flag that sets how long it may take). Any other error is returned
// as it is. cmd is the command that ran (nil when none was found).
func explain(cmd *cobra.Command, err error) error {
	if err == nil {
		return nil
	}
	addr := os.Getenv("BC_ADDR")
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return keepCode(err, fmt.Errorf("cannot reach the API at %s: is `better-compute serve` (or `better-compute dev`) running, and is BC_ADDR its address?", addr))
	case errors.As(err, &dnsErr):
		return keepCode(err, fmt.Errorf("cannot reach the API at %s: the host name does not resolve; check BC_ADDR", addr))
	case timedOut(err):
		return keepCode(err, timeoutError(cmd, addr, err))
	}
	return err
}

// timedOut reports a deadline: a context's, or the HTTP client's own.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// timeoutError names what timed out and the flag that sets how long it may
// take, when the command has one.
func timeoutError(cmd *cobra.Command, addr string, err error) error {
	if cmd != nil {
		if f := cmd.Flags().Lookup("timeout"); f != nil {
			return fmt.Errorf("%s timed out after %s: raise --timeout (see %s --help) [%w]", cmd.CommandPath(), f.Value, cmd.CommandPath(), err)
		}
	}
	return fmt.Errorf("the API at %s did not answer in time: check that it is running and reachable, then try again [%w]", addr, err)
}

// keepCode gives msg the exit status err carried (1 when none).
func keepCode(err, msg error) error {
	var ee *ExitError
	if errors.As(err, &ee) {
		return &ExitError{Code: ee.Code, Err: msg}
	}
	return &ExitError{Code: 1, Err: msg}
}
