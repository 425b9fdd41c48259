// Package internalv1 holds the generated protobuf and gRPC code for the
// control plane's internal channel (internal.proto): the calls a gateway
// process relays to the process that holds the keys. The generated files
// are committed; regenerate them with
// `cd internal/proto/internalv1 && go generate .`.
package internalv1

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative internal.proto
