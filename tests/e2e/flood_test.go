package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// streamFlood is a peer that opens Heartbeat calls on the registry and never sends their
// message: HEADERS without DATA, on conns HTTP/2 connections of perConn streams each, as the
// attacker of issue 35 did. A stream the server ends (reset, or answered) is opened again, and
// a connection it closes is dialled again, both at most once per tick, so the peer keeps as
// many streams waiting as the gateway lets it.
type streamFlood struct {
	sent   atomic.Int64 // HEADERS frames sent
	open   atomic.Int64 // streams sent and not yet ended by the server
	dialed atomic.Int64 // connections made
	wg     sync.WaitGroup
}

// flood starts the peer from the local address from to addr until ctx ends; token, when not
// empty, is sent as its bearer token.
func flood(ctx context.Context, from net.IP, addr, token string, conns, perConn int, tick time.Duration) *streamFlood {
	f := &streamFlood{}
	for range conns {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			t := time.NewTicker(tick)
			defer t.Stop()
			for ctx.Err() == nil {
				f.conn(ctx, from, addr, token, perConn, t.C)
				select {
				case <-ctx.Done():
				case <-t.C:
				}
			}
		}()
	}
	return f
}

// conn holds one connection's streams until the server closes it or ctx ends.
func (f *streamFlood) conn(ctx context.Context, from net.IP, addr, token string, perConn int, tick <-chan time.Time) {
	d := net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: from}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return
	}
	f.dialed.Add(1)
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	defer c.Close()
	var hbuf bytes.Buffer
	enc := hpack.NewEncoder(&hbuf)
	fields := [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", "/tl.control.v1.WorkerRegistry/Heartbeat"},
		{":authority", addr}, {"content-type", "application/grpc"}, {"te", "trailers"},
	}
	if token != "" {
		fields = append(fields, [2]string{"authorization", "Bearer " + token})
	}
	for _, h := range fields {
		_ = enc.WriteField(hpack.HeaderField{Name: h[0], Value: h[1]})
	}
	block := hbuf.Bytes()

	var mu sync.Mutex // the framer's writes: this goroutine's and the reader's acks
	fr := http2.NewFramer(c, c)
	if _, err := c.Write([]byte(http2.ClientPreface)); err != nil {
		return
	}
	if err := fr.WriteSettings(); err != nil {
		return
	}
	next := uint32(1)
	// live: the streams of this connection the server has not ended (at most perConn); the
	// server may end one twice (trailers, then a reset), which counts once.
	live := map[uint32]bool{}
	done := make(chan struct{})
	defer func() {
		mu.Lock()
		f.open.Add(-int64(len(live)))
		mu.Unlock()
	}()
	go func() { // the reader: acks, and which streams the server ended
		defer close(done)
		for {
			fr2, err := fr.ReadFrame()
			if err != nil {
				return
			}
			var end uint32
			switch fm := fr2.(type) {
			case *http2.SettingsFrame:
				if !fm.IsAck() {
					mu.Lock()
					_ = fr.WriteSettingsAck()
					mu.Unlock()
				}
			case *http2.PingFrame:
				if !fm.IsAck() {
					mu.Lock()
					_ = fr.WritePing(true, fm.Data)
					mu.Unlock()
				}
			case *http2.RSTStreamFrame:
				end = fm.StreamID
			case *http2.HeadersFrame:
				if fm.StreamEnded() {
					end = fm.StreamID
				}
			case *http2.DataFrame:
				if fm.StreamEnded() {
					end = fm.StreamID
				}
			case *http2.GoAwayFrame:
				return
			}
			if end != 0 {
				mu.Lock()
				if live[end] {
					delete(live, end)
					f.open.Add(-1)
				}
				mu.Unlock()
			}
		}
	}()
	for {
		mu.Lock()
		for len(live) < perConn && next < 1<<30 {
			err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: next, BlockFragment: block, EndHeaders: true})
			if err != nil {
				mu.Unlock()
				return
			}
			live[next] = true
			next += 2
			f.open.Add(1)
			f.sent.Add(1)
		}
		mu.Unlock()
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		case <-tick:
		}
	}
}

// TestStreamFloodKeepsTheFleetRoutable (R20, issue 35's pre-auth stream exhaustion): a peer on
// another address opens 100 connections × 100 Heartbeat streams that send no message and
// keeps them open, against a registry whose call bound is small (max_workers = 8, so 1,032
// calls). Before, each stream held a call place with no deadline: real heartbeats got
// ResourceExhausted and the whole fleet was evicted within k·T. Now an unauthenticated stream
// is refused before it takes a place, a credentialed one is capped per peer and ended when its
// message has not come within a second, and the engines stay routable for 3·k·T and answer.
func TestStreamFloodKeepsTheFleetRoutable(t *testing.T) {
	for name, attackerToken := range map[string]string{"no token": "", "a valid token": "token-b"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("TLENGINE_TOKEN", "token-a")
			const hb, k = 500 * time.Millisecond, 3
			f := startFleet(t, fmt.Sprintf(`
[gateway]
http_listen = "127.0.0.1:0"
registry_listen = "127.0.0.1:0"
heartbeat_interval = "%v"
heartbeat_miss_limit = %d
[registry]
max_workers = 8
tokens = [{ token = "token-a", id_prefix = "e-" }, { token = "token-b", id_prefix = "x-" }]
`, hb, k), []string{"e-1", "--model", "smol"}, []string{"e-2", "--model", "smol"})

			ctx, cancel := context.WithCancel(context.Background())
			fl := flood(ctx, net.IPv4(127, 0, 0, 2), f.gw.GRPCAddr, attackerToken, 100, 100, 500*time.Millisecond)
			defer func() { cancel(); fl.wg.Wait() }()
			eventually(t, "the flood sent 10,000 streams", 20*time.Second, func() bool { return fl.sent.Load() >= 10000 })

			end := time.Now().Add(3 * k * hb)
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			polls := 0
			for time.Now().Before(end) {
				ws := f.workers(t)
				routable := 0
				for _, w := range ws {
					if w.Routable {
						routable++
					}
				}
				if routable != 2 {
					t.Fatalf("after %d polls under the flood (%d streams sent, %d open, %d connections made): workers %+v, want e-1 and e-2 routable",
						polls, fl.sent.Load(), fl.open.Load(), fl.dialed.Load(), ws)
				}
				polls++
				<-tick.C
			}
			if code, _ := completeOnce(f.base, "smol"); code != 200 {
				t.Fatalf("a completion under the flood: %d, want 200", code)
			}
			t.Logf("%s: %d streams sent, %d open at the end, %d connections made; %d polls all routable",
				name, fl.sent.Load(), fl.open.Load(), fl.dialed.Load(), polls)
		})
	}
}
