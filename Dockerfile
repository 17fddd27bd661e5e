# syntax=docker/dockerfile:1
# tlgw's container image: a static binary (no cgo) on distroless/static, running as a numeric
# non-root user. Nothing is written to the image's filesystem at run time: the configuration is
# read from /etc/tlgw/tlgw.toml (a mounted ConfigMap in deploy/helm/tlgw), secrets come from the
# environment (key_env, token_env, password_env), so the root filesystem can be read-only.
#   docker build -t tlgw:dev --build-arg VERSION=$(git describe --always) .

FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=devel
# cmd/tlgw/default.pgo is applied by the default -pgo=auto.
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" \
	-o /out/tlgw ./cmd/tlgw

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/tlgw /usr/local/bin/tlgw
USER 65532:65532
# 8080: the OpenAI HTTP API, /healthz, /readyz, /metrics. 9090: the engines' gRPC registry.
EXPOSE 8080 9090
ENTRYPOINT ["/usr/local/bin/tlgw", "serve", "--config", "/etc/tlgw/tlgw.toml"]
