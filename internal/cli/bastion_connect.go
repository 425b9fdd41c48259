package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/client"
)

// bastionsConnectCmd is `better-compute bastions connect`: a loopback
// listener whose every connection goes through the control plane's tunnel
// to one lane on a bastion.
func bastionsConnectCmd() *cobra.Command {
	var bastion, lane, listen string
	c := &cobra.Command{
		Use:   "connect --bastion ID --lane LANE --listen 127.0.0.1:L",
		Short: "Reach one lane of a bastion (inference/ollama|inference/llm|inference/pii|service/NAME|egress/HOST:PORT) on a local port",
		Long: "Accept connections on a loopback address; each goes through the control plane's WireGuard tunnel to one lane " +
			"on the bastion, decided compute:bastions:connect on the bastion here and checked again by the bastion against the " +
			"grants it holds (deny beats allow) when it accepts. The bastion audits every accept and refusal on its own " +
			"machine and in this control plane's audit log.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if bastion == "" || lane == "" {
				return &ExitError{Code: 2, Err: errors.New("--bastion and --lane are required")}
			}
			ap, err := netip.ParseAddrPort(listen)
			if err != nil || !ap.Addr().IsLoopback() {
				return &ExitError{Code: 2, Err: errors.New("--listen must be a loopback address and port, such as 127.0.0.1:18434 (anyone who reaches the listener reaches the bastion as you)")}
			}
			cl, err := apiClient()
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runLaneListen(ctx, cl, bastion, lane, ap.String(), cmd)
		},
	}
	c.Flags().StringVar(&bastion, "bastion", "", "bastion id")
	c.Flags().StringVar(&lane, "lane", "", "inference/ollama, inference/llm, inference/pii, service/NAME or egress/HOST:PORT")
	c.Flags().StringVar(&listen, "listen", "", "loopback address to accept connections on (127.0.0.1:PORT)")
	return c
}

// runLaneListen accepts on addr until ctx ends, each connection carried
// over its own lane.
func runLaneListen(ctx context.Context, cl *client.Client, bastion, lane, addr string, cmd *cobra.Command) error {
	return acceptLoop(ctx, addr, fmt.Sprintf("to lane %s on bastion %s", lane, bastion), "lane", cmd.ErrOrStderr(),
		func(c *net.TCPConn) error { return carryLane(ctx, cl, bastion, lane, c) })
}

// carryLane carries one local connection over its own lane.
func carryLane(ctx context.Context, cl *client.Client, bastion, lane string, conn *net.TCPConn) error {
	l, err := cl.ConnectLane(ctx, bastion, lane)
	if err != nil {
		return err
	}
	defer l.Close()
	stop := context.AfterFunc(ctx, func() { _ = l.Close() })
	defer stop()
	go func() {
		_, _ = io.Copy(l, conn)
	}()
	_, err = io.Copy(conn, l)
	_ = conn.CloseWrite()
	return err
}
