package mcpgate

import (
	"context"
	"io"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bettercompute/bettercompute/client"
)

// stdioCaller names the one caller of a gate served over standard input
// and output: the process and its configured key.
const stdioCaller = "stdio"

// ServeStdio serves the gate over in and out (newline-delimited JSON-RPC)
// for the one caller api speaks for, until in is closed or ctx ends. Every
// tool call is a call of the public API with api's key.
func (g *Gate) ServeStdio(ctx context.Context, api *client.Client, in io.ReadCloser, out io.WriteCloser) error {
	who := Caller{API: unbounded(api), ID: stdioCaller}
	s := g.server(func(context.Context, *mcp.CallToolRequest) (Caller, error) { return who, nil })
	return s.Run(ctx, &mcp.IOTransport{Reader: in, Writer: out})
}

// unbounded returns a copy of c without its client-wide timeout: a tool's
// wait (a command, an exec of up to 10 minutes) is bounded by the tool's
// own context instead.
func unbounded(c *client.Client) *client.Client {
	cp := *c
	h := http.Client{}
	if c.HTTP != nil {
		h = *c.HTTP
	}
	h.Timeout = 0
	cp.HTTP = &h
	return &cp
}
