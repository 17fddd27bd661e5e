package kvzmq

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/tlgw/tlgw/internal/vllmkv"
	"github.com/tlgw/tlgw/internal/zmtpguard"
)

// replayFrom asks a replay endpoint (a ROUTER, "tcp://host:port") for every retained batch with
// seq ≥ from: it sends [empty delimiter, from as 8 bytes big-endian] from a DEALER and hands
// each batch to f until the sentinel (seq 2^64−1), f returning false, or ctx ending; a replay
// of more than max batches fails. An answer has one of the shapes replayMessage reads.
func replayFrom(ctx context.Context, o Options, endpoint string, from uint64, max int, f func(vllmkv.Batch) bool) error {
	d := net.Dialer{Timeout: o.DialTimeout}
	c, err := d.DialContext(ctx, "tcp", strings.TrimPrefix(endpoint, "tcp://"))
	if err != nil {
		return err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	g := zmtpguard.Wrap(c, o.guard(), o.Clock.Now())
	zc, err := zmq4.Open(g, null.Security(), zmq4.Dealer, zmq4.SocketIdentity("tlgw-replay"), false, nil)
	if err != nil {
		return err
	}
	var seq [8]byte
	binary.BigEndian.PutUint64(seq[:], from)
	if err := zc.SendMsg(zmq4.NewMsgFrom([]byte{}, seq[:])); err != nil {
		return err
	}
	for n := 0; n <= max; n++ { // max batches, then the sentinel
		msg, err := zc.RecvMsg()
		if err != nil {
			return err
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		b, end, err := replayMessage(msg.Frames, o.Limits)
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		if end {
			return nil
		}
		if n == max {
			break // a batch past max: f never sees it
		}
		if !f(b) {
			return nil
		}
	}
	return fmt.Errorf("replay: more than %d batches", max)
}

// errReplayShape: a replay answer of none of the known shapes.
var errReplayShape = errors.New("a replay answer is [empty, topic, seq, payload], [topic, seq, payload], [empty, seq, payload] or [seq, payload], with an 8-byte seq")

// replayMessage reads one replay answer (its frames as the DEALER received them):
//
//	[empty, topic, seq, payload]  the live message's frames behind the delimiter (tlengine's default)
//	[topic, seq, payload]         the same without the delimiter
//	[empty, seq, payload]         vLLM's answer: no topic (read as an empty topic)
//	[seq, payload]                vLLM's answer as a REQ socket or a delimiter-less ROUTER gives it
//
// end reports the sentinel (seq 2^64−1; its payload, empty from every known engine, is not
// read). A seq is exactly 8 bytes; the payload is decoded within l.
func replayMessage(frames [][]byte, l vllmkv.Limits) (b vllmkv.Batch, end bool, err error) {
	switch {
	case len(frames) == 4 && len(frames[0]) == 0:
		frames = frames[1:]
	case len(frames) == 3:
		// [topic, seq, payload], or vLLM's [empty, seq, payload]: the same frames with an empty topic.
	case len(frames) == 2:
		frames = [][]byte{{}, frames[0], frames[1]}
	default:
		return vllmkv.Batch{}, false, fmt.Errorf("%w: %d frames", errReplayShape, len(frames))
	}
	if len(frames[1]) != 8 {
		return vllmkv.Batch{}, false, fmt.Errorf("%w: a seq of %d bytes", errReplayShape, len(frames[1]))
	}
	if binary.BigEndian.Uint64(frames[1]) == vllmkv.ReplaySentinelSeq {
		return vllmkv.Batch{}, true, nil
	}
	b, err = vllmkv.DecodeMessage(frames, l)
	return b, false, err
}
