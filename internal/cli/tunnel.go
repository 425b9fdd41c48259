package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/signal"
	"sync"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/clisafe"
)

// tunnelCmd is `better-compute tunnel`: a port on a node's loopback,
// through the node's own session, with a ticket per connection.
func tunnelCmd() *cobra.Command {
	var node, listen string
	var port int
	var stdio bool
	c := &cobra.Command{
		Use:   "tunnel --node ID --port P (--listen 127.0.0.1:L | --stdio)",
		Short: "Forward a port on a node's loopback through its own session (each connection with its own single-use ticket)",
		Long: "Forward a port on a node's loopback (127.0.0.1:P on the node, never another address) through the node's own " +
			"mutual-TLS session: the node opens no inbound port. Each connection asks tunnels.open for its own ticket (decided " +
			"compute:nodes:tunnel on the node; at most 10 a minute per identity), which the control plane, the gateway and the " +
			"node each verify. The node serves only the ports on its own allow list (bcd node --tunnel-port, default 22). " +
			"An open tunnel is re-decided every few seconds and closed when your access is revoked, and after 12 hours.\n\n" +
			"--listen ADDR accepts connections on a loopback address until interrupted; --stdio serves one connection on " +
			"standard input and output (for ssh's ProxyCommand).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if node == "" {
				return &ExitError{Code: 2, Err: errors.New("--node is required")}
			}
			if port < 1 || port > 65535 {
				return &ExitError{Code: 2, Err: errors.New("--port: a port is 1 to 65535")}
			}
			if (listen == "") == !stdio {
				return &ExitError{Code: 2, Err: errors.New("give exactly one of --listen 127.0.0.1:PORT or --stdio")}
			}
			var ap netip.AddrPort
			if listen != "" {
				var err error
				if ap, err = netip.ParseAddrPort(listen); err != nil || !ap.Addr().IsLoopback() {
					return &ExitError{Code: 2, Err: errors.New("--listen must be a loopback address and port, such as 127.0.0.1:18923 (anyone who reaches the listener reaches the node as you)")}
				}
			}
			cl, err := apiClient()
			if err != nil {
				return err
			}
			if err := resolveArg(cmd, cl, "node", &node); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if stdio {
				// The stream's bytes are not text for a terminal: they go
				// out unfiltered (clisafe.Raw), or a protocol such as ssh's
				// would lose its control bytes.
				return apiErr(runTunnelStdio(ctx, cl, node, port, cmd.InOrStdin(), clisafe.Raw(cmd.OutOrStdout())))
			}
			return runTunnelListen(ctx, cl, node, port, ap.String(), cmd)
		},
	}
	c.Flags().StringVar(&node, "node", "", "node id")
	c.Flags().IntVar(&port, "port", 0, "port on the node's loopback")
	c.Flags().StringVar(&listen, "listen", "", "loopback address to accept connections on (127.0.0.1:PORT)")
	c.Flags().BoolVar(&stdio, "stdio", false, "serve one connection on standard input and output")
	return c
}

// runTunnelStdio carries one tunnel between in/out and the node.
func runTunnelStdio(ctx context.Context, cl *client.Client, node string, port int, in io.Reader, out io.Writer) error {
	return carry(ctx, cl, node, port, in, out, func() {})
}

// runTunnelListen accepts connections on addr until ctx ends, each
// carried over its own tunnel.
func runTunnelListen(ctx context.Context, cl *client.Client, node string, port int, addr string, cmd *cobra.Command) error {
	return acceptLoop(ctx, addr, fmt.Sprintf("to port %d on node %s", port, node), "tunnel", cmd.ErrOrStderr(),
		func(c *net.TCPConn) error { return forwardConn(ctx, cl, node, port, c) })
}

// acceptLoop accepts on the loopback address addr until ctx ends and
// serves each connection with serve in its own goroutine, printing a
// failure (as what from the peer) on stderr; it waits for them to end.
func acceptLoop(ctx context.Context, addr, banner, what string, stderr io.Writer, serve func(*net.TCPConn) error) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return &ExitError{Code: 2, Err: fmt.Errorf("--listen: %w", err)}
	}
	stop := context.AfterFunc(ctx, func() { _ = lis.Close() })
	defer stop()
	fmt.Fprintf(stderr, "forwarding %s %s (Ctrl-C to stop)\n", lis.Addr(), banner)
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex
	for {
		conn, err := lis.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			if err := serve(conn.(*net.TCPConn)); err != nil {
				mu.Lock()
				fmt.Fprintf(stderr, "%s from %s: %v\n", what, conn.RemoteAddr(), apiErr(err))
				mu.Unlock()
			}
		}()
	}
}

// forwardConn carries one local connection over its own tunnel.
func forwardConn(ctx context.Context, cl *client.Client, node string, port int, conn *net.TCPConn) error {
	return carry(ctx, cl, node, port, conn, conn, func() { _ = conn.CloseWrite() })
}

// carry opens one tunnel to port on node and carries in to it and it to
// out, half-closing each way at its end (outDone after the node's side
// ended), until both ends ended or ctx did; it returns how the tunnel
// ended (nil in order).
func carry(ctx context.Context, cl *client.Client, node string, port int, in io.Reader, out io.Writer, outDone func()) error {
	t, err := cl.OpenTunnel(ctx, node, port)
	if err != nil {
		return err
	}
	defer t.Close()
	stop := context.AfterFunc(ctx, func() { _ = t.Close() })
	defer stop()
	go func() {
		_, _ = io.Copy(t, in)
		_ = t.CloseWrite()
	}()
	_, err = io.Copy(out, t)
	outDone()
	if err != nil {
		return err
	}
	return t.Wait()
}
