package contracts

// Regenerating the Go code of the .proto files needs protoc on PATH; the two
// code generators are installed at pinned versions into $(go env GOPATH)/bin.
// The generated files are committed, so building never needs protoc.
// `make proto` runs these directives.

//go:generate sh -c "GOBIN=\"$(go env GOPATH)/bin\" go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12"
//go:generate sh -c "GOBIN=\"$(go env GOPATH)/bin\" go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.5.1"
//go:generate sh -c "PATH=\"$(go env GOPATH)/bin:$PATH\" protoc -I . --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative tl/control/v1/control.proto tl/kv/v1/kv.proto tl/engine/v1/engine.proto tl/replica/v1/replica.proto"
