// Package nodev1 holds the generated protobuf and gRPC code for the
// node-facing protocol (node.proto) and its tickets (ticket.proto). The
// generated files are committed; regenerate them with
// `go generate ./internal/proto/...`.
package nodev1

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative node.proto ticket.proto
