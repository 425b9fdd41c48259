// Package mcpgate is the MCP gate: a Model Context Protocol server (the
// official Go SDK) through which an AI agent reaches Better Compute with
// its own API key. `better-compute mcp` serves it over standard input and
// output; the api role serves it over streamable HTTP at /mcp.
//
// The gate is a client of the public API, never a second way in: every
// tool call is one or more calls of the API's methods through the same
// HTTP envelope (authentication, CSRF header, limits, tenancy, the IAM
// decision, audit) that any other client passes, carrying the agent's own
// key. It reads no database and holds no authority of its own. On top of
// the API it adds the narrow rules an agent gets:
//   - only well-formed ids are accepted, checked before anything is called;
//   - no tool takes or returns SSH keys: an input carrying key material is
//     refused, and key fields or key text are removed from every answer;
//   - one caller has at most MaxInFlight tool calls in flight; one more is
//     refused at once (a semaphore, not a queue);
//   - a destructive command kind is refused before it is sent;
//   - the gate never answers a confirmation for the agent: an answer that
//     asks for a person's approval is returned as a tool error saying so,
//     and no tool approves anything.
package mcpgate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/bettercompute/bettercompute/client"
	"github.com/bettercompute/bettercompute/internal/buildinfo"
	"github.com/bettercompute/bettercompute/internal/clock"
	"github.com/bettercompute/bettercompute/internal/errs"
	"github.com/bettercompute/bettercompute/internal/jsonstrict"
)

// MaxInFlight is how many tool calls one caller may have in flight.
const MaxInFlight = 4

// Options configure a Gate. The zero value is usable.
type Options struct {
	// Log receives the gate's own log lines (default slog.Default()); the
	// SDK's own are not logged.
	Log *slog.Logger
	// Clock paces the polls of a command the gate waits for (default
	// the real clock).
	Clock clock.Clock
	// Poll is the interval between polls of a command or fan-out the
	// gate waits for (default 250 ms).
	Poll time.Duration
	// Hold, when set, is called by every tool call once it holds its
	// in-flight slot and before it calls the API: tests use it to keep
	// calls in flight deterministically.
	Hold func(ctx context.Context, tool string)
}

// Gate holds what every session of one process shares: the in-flight
// limits of its callers.
type Gate struct {
	opts     Options
	inflight *inFlight
}

// New returns a Gate with opts.
func New(opts Options) *Gate {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Poll <= 0 {
		opts.Poll = 250 * time.Millisecond
	}
	return &Gate{opts: opts, inflight: newInFlight(MaxInFlight)}
}

// Caller is who one tool call is made for: the API client carrying the
// caller's own key, and the name its in-flight slots are counted under.
type Caller struct {
	API *client.Client
	ID  string
}

// resolver finds the caller of one tool call.
type resolver func(ctx context.Context, req *mcp.CallToolRequest) (Caller, error)

// Server returns an MCP server whose every tool call is made as the
// caller resolve names.
func (g *Gate) server(resolve resolver) *mcp.Server {
	return g.serverWith(nil, resolve)
}

// implementation names the gate to MCP clients.
func implementation() *mcp.Implementation {
	return &mcp.Implementation{Name: "better-compute", Title: "Better Compute", Version: buildinfo.Read().Version}
}

// instructions tell the agent the gate's rules.
const instructions = "Better Compute: fleet nodes, signed commands, sandboxes and the audit log. " +
	"Every call is made with your API key and decided by its permissions. Ids must be well-formed. " +
	"At most 4 calls may be in flight at once. A request that needs your person's confirmation is " +
	"answered CONFIRMATION_REQUIRED: ask the person to approve it, then retry the same call."

// handler is one tool's work with its typed input.
type handler[In any] func(ctx context.Context, api *client.Client, in In) (any, error)

// argsChecks are each tool's check of its raw arguments (decodeArgs),
// by tool name; a server's map is filled as its tools are added, before
// it serves.
type argsChecks map[string]func(json.RawMessage) error

// strictArguments refuses a tools/call whose arguments its tool's check
// refuses, before the SDK decodes them: the SDK would take the last of
// duplicate keys, keep bytes that are not UTF-8 as U+FFFD, and answer a
// number out of range with Go's own error, which names Go types.
func strictArguments(checks argsChecks) mcp.Middleware {
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if r, ok := req.(*mcp.CallToolRequest); ok && method == "tools/call" && r.Params != nil && len(r.Params.Arguments) > 0 {
				if check := checks[r.Params.Name]; check != nil {
					if err := check(r.Params.Arguments); err != nil {
						var res mcp.CallToolResult
						res.SetError(err)
						return &res, nil
					}
				}
			}
			return next(ctx, method, req)
		}
	}
}

// decodeArgs checks raw as In's arguments: strictly JSON (jsonstrict) and
// of the fields' types and ranges, each refusal INVALID_INPUT naming the
// field by its JSON name, never a Go type.
func decodeArgs[In any](raw json.RawMessage) error {
	if err := jsonstrict.Check(raw, "arguments object"); err != nil {
		return err
	}
	var in In
	err := json.Unmarshal(raw, &in)
	var te *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &te) && te.Field != "":
		return errs.New(errs.InvalidInput, fmt.Sprintf("field %q: wrong type or out of range", te.Field))
	default:
		return errs.New(errs.InvalidInput, "the arguments must be a JSON object of the tool's fields")
	}
}

// addTool registers a tool whose calls are checked, limited and scrubbed
// alike: the raw arguments are checked first (decodeArgs, through
// checks), then the input is validated (check), then the call takes an
// in-flight slot of its caller or is refused, then the API is called.
func addTool[In any](g *Gate, s *mcp.Server, checks argsChecks, resolve resolver, t *mcp.Tool, check func(In) error, h handler[In]) {
	checks[t.Name] = decodeArgs[In]
	mcp.AddTool(s, t, func(ctx context.Context, req *mcp.CallToolRequest, in In) (*mcp.CallToolResult, any, error) {
		if err := check(in); err != nil {
			return nil, nil, err
		}
		who, err := resolve(ctx, req)
		if err != nil {
			return nil, nil, err
		}
		release, ok := g.inflight.acquire(who.ID)
		if !ok {
			g.opts.Log.Info("mcp tool call refused: too many in flight", "tool", t.Name, "max", MaxInFlight)
			return nil, nil, errs.New(errs.RateLimited, "too many tool calls in flight: at most 4 per caller; wait for one to finish")
		}
		defer release()
		if g.opts.Hold != nil {
			g.opts.Hold(ctx, t.Name)
		}
		out, err := h(ctx, who.API, in)
		if err != nil {
			return nil, nil, toolError(err)
		}
		return nil, scrub(out), nil
	})
}

// CodeConfirmationRequired is the API's answer to a call that must wait
// for the caller's person to confirm it.
const CodeConfirmationRequired = "CONFIRMATION_REQUIRED"

// toolError turns an API answer into the tool error the agent reads: the
// code and message verbatim, and for a held-back request what must happen
// next. The gate never approves or retries it itself.
func toolError(err error) error {
	var e *client.Error
	if !errors.As(err, &e) {
		return err
	}
	if e.Code == CodeConfirmationRequired || e.Code == string(errs.ApprovalRequired) {
		return &confirmationError{api: e}
	}
	return e
}

// confirmationError is a held-back request, passed to the agent.
type confirmationError struct{ api *client.Error }

func (c *confirmationError) Error() string {
	return c.api.Error() + "; a person must approve this request (better-compute approvals list, then approvals approve ID); " +
		"this gate cannot approve it for you: once approved, retry the same call unchanged"
}

func (c *confirmationError) Unwrap() error { return c.api }
