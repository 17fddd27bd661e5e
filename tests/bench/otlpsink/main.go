// Command otlpsink is the trace collector of the tracing benchmarks (tests/bench/README.md):
// an OTLP/gRPC trace service on loopback that counts the spans it is sent and keeps none, so
// a gateway with [tracing] on exports to a live collector as it would in production. It
// prints "otlpsink listening ADDR" once it serves and the span count when it is stopped.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// sink counts spans; it holds nothing else.
type sink struct {
	coltracepb.UnimplementedTraceServiceServer
	spans atomic.Int64
}

func (s *sink) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			s.spans.Add(int64(len(ss.GetSpans())))
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func main() {
	addr := flag.String("listen", "127.0.0.1:0", "the address to serve OTLP/gRPC on")
	flag.Parse()
	lis, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(16 << 20))
	s := &sink{}
	coltracepb.RegisterTraceServiceServer(srv, s)
	fmt.Printf("otlpsink listening %s\n", lis.Addr())
	go func() {
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
		<-stop
		srv.Stop()
	}()
	if err := srv.Serve(lis); err != nil {
		log.Print(err)
	}
	fmt.Printf("otlpsink spans %d\n", s.spans.Load())
}
