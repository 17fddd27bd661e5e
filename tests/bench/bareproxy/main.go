// Command bareproxy is the baseline of the proxy benchmark (tests/bench): the standard
// library's httputil.ReverseProxy buffering the request body, round robin over the upstreams
// named as arguments, with nothing else on the path. It prints
// "bareproxy listening http=ADDR" once it serves, and answers GET /__mallocs with the
// process's heap allocation count so far, so the benchmark can report allocations per request
// for the baseline as it does for the gateway (from /metrics).
package main

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"runtime/metrics"
	"sync/atomic"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: bareproxy UPSTREAM_HOST:PORT...")
		os.Exit(2)
	}
	targets := make([]*url.URL, 0, len(os.Args)-1)
	for _, u := range os.Args[1:] {
		targets = append(targets, &url.URL{Scheme: "http", Host: u})
	}
	var next atomic.Uint64
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			body, _ := io.ReadAll(r.In.Body)
			r.Out.Body = io.NopCloser(bytes.NewReader(body))
			r.Out.ContentLength = int64(len(body))
			r.SetURL(targets[next.Add(1)%uint64(len(targets))])
		},
		Transport: &http.Transport{
			MaxIdleConns: 4096, MaxIdleConnsPerHost: 1024, IdleConnTimeout: 90 * time.Second,
			DisableCompression: true,
		},
		ErrorLog: log.New(io.Discard, "", 0),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /__mallocs", func(w http.ResponseWriter, _ *http.Request) {
		s := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}
		metrics.Read(s)
		fmt.Fprintln(w, s[0].Value.Uint64())
	})
	mux.Handle("/", proxy)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("bareproxy listening http=%s\n", lis.Addr())
	log.Fatal((&http.Server{Handler: mux}).Serve(lis))
}
