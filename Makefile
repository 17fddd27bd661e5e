.PHONY: proto test

proto:
	go generate ./contracts/

test:
	go test -race ./...
