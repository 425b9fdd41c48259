// Package apitypes holds the wire shapes of the public API's methods: the
// inputs the server decodes and the answers it builds itself, declared
// once for the server's method table (package api) and the Go client
// (package client) alike.
//
// It is a leaf: it imports only the standard library, so the client can
// use it without pulling in the server, the modules or a database driver
// (TestLeaf holds it to that). It lives under internal/api rather than at
// the module root because it is not an API of its own: the client shows
// the types its callers name as aliases (client.APIKey = apitypes.APIKey),
// so the client stays the one public Go API and the server and client
// change a shape in one commit.
//
// Each input field carries its bound in an `api` tag, which the server's
// strict decoder enforces (see api.Decode); `omitempty` on an input only
// shapes what the client sends (an absent field decodes as its zero
// value). Inputs whose fields are module types (roles' IAM statements,
// templates) stay in package api.
//
// The answers that are module types (a node, a command, a tenant, a
// batch, a sandbox) are still the modules' own types on the server; the
// client keeps its copies of those until the modules return wire types.
package apitypes

import (
	"encoding/json"
	"time"
)

// TenantIn names the tenant a call acts in ("" is the caller's own).
type TenantIn struct {
	TenantID string `json:"tenant_id,omitempty" api:"max=64"`
}

// Tenant returns the tenant the input names.
func (t TenantIn) Tenant() string { return t.TenantID }

// IDIn names one resource by id.
type IDIn struct {
	ID string `json:"id" api:"max=64"`
}

// TenantIDIn names one resource of a tenant by id (bindings.delete,
// identities.delete, sessions.revoke).
type TenantIDIn struct {
	TenantIn
	ID string `json:"id,omitempty" api:"max=64"`
}

// NodeRevokeIn is nodes.revoke's input: every certificate of the node, or
// only Serial.
type NodeRevokeIn struct {
	NodeID string `json:"node_id" api:"max=64"`
	Serial string `json:"serial,omitempty" api:"max=128"`
}

// NodeRestrictIn is nodes.restrict's input.
type NodeRestrictIn struct {
	NodeID       string   `json:"node_id" api:"max=64"`
	Serial       string   `json:"serial" api:"max=128"`
	AllowedKinds []string `json:"allowed_kinds" api:"items=64,max=64"`
}

// JoinTokenIn is joinTokens.create's input.
type JoinTokenIn struct {
	TenantIn
	Role       string `json:"role" api:"max=32"`
	Name       string `json:"name" api:"max=63"`
	TTLSeconds int64  `json:"ttl_seconds" api:"min=0,max=604800"`
}

// JoinTokensIn is joinTokens.createMany's input.
type JoinTokensIn struct {
	TenantIn
	Role       string `json:"role,omitempty" api:"max=32"`
	Count      int    `json:"count" api:"min=1,max=10000"`
	TTLSeconds int64  `json:"ttl_seconds,omitempty" api:"min=0,max=604800"`
}

// CommandIn is commands.create's input.
type CommandIn struct {
	NodeID     string          `json:"node_id" api:"max=64"`
	Kind       string          `json:"kind" api:"max=64"`
	Payload    json.RawMessage `json:"payload,omitempty"`
	TTLSeconds int64           `json:"ttl_seconds,omitempty" api:"min=0,max=86400"`
}

// FanoutIn is commands.fanout's input: one command per node named by id
// or picked by labels.
type FanoutIn struct {
	TenantIn
	NodeIDs    []string          `json:"node_ids,omitempty" api:"items=10000,max=64"`
	Labels     map[string]string `json:"labels,omitempty" api:"items=64,keymax=63,max=63"`
	Kind       string            `json:"kind" api:"max=64"`
	Payload    json.RawMessage   `json:"payload,omitempty"`
	TTLSeconds int64             `json:"ttl_seconds,omitempty" api:"min=0,max=86400"`
}

// FanoutOut is commands.fanout's answer.
type FanoutOut struct {
	CommandIDs []string `json:"command_ids"`
	Count      int      `json:"count"`
	// FanoutID groups the commands (commands.list fanout_id,
	// commands.fanoutSummary).
	FanoutID string `json:"fanout_id"`
}

// CommandListIn is commands.list's input.
type CommandListIn struct {
	TenantIn
	NodeID string `json:"node_id,omitempty" api:"max=64"`
	State  string `json:"state,omitempty" api:"max=32"`
	Limit  int    `json:"limit,omitempty" api:"min=0,max=1000"`
	// FanoutID keeps one fan-out's commands.
	FanoutID string `json:"fanout_id,omitempty" api:"max=64"`
}

// EventListIn is events.list's input.
type EventListIn struct {
	Type string `json:"type,omitempty" api:"max=128"`
}

// RevokedOut is nodes.revoke's answer: how many certificates it revoked.
type RevokedOut struct {
	Revoked int `json:"revoked"`
}

// IDOut is an answer that is only the id of what was made.
type IDOut struct {
	ID string `json:"id"`
}

// ErrorBody is the JSON shape of every error answer: the code (such as
// ACCESS_DENIED), a message safe to show, and the request id.
type ErrorBody struct {
	Error struct {
		Code      string `json:"code"`
		Message   string `json:"message"`
		RequestID string `json:"request_id"`
	} `json:"error"`
}

// RevocationsListIn is revocations.list's input: the entries after seq
// Since (0: from the start), at most Limit (0: 100, at most 1000).
type RevocationsListIn struct {
	TenantIn
	Since int64 `json:"since,omitempty" api:"min=0,max=9007199254740991"`
	Limit int   `json:"limit,omitempty" api:"min=0,max=1000"`
}

// Revocation is one entry of the revocation feed as revocations.list
// shows it. Signed says whether a worker has signed it yet (nodes get
// only signed entries).
type Revocation struct {
	Seq        int64     `json:"seq"`
	Kind       string    `json:"kind"`
	Subject    string    `json:"subject"`
	TenantID   string    `json:"tenant_id"`
	NodeID     string    `json:"node_id,omitempty"`
	At         time.Time `json:"at"`
	Reason     string    `json:"reason"`
	Generation uint64    `json:"generation,omitempty"`
	Signed     bool      `json:"signed"`
}
