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

// errReplayEnd: the replay endpoint's sentinel arrived.
var errReplayEnd = errors.New("replay ended")

// replayFrom asks a replay endpoint (a ROUTER, "tcp://host:port") for every retained batch with
// seq ≥ from: it sends [empty delimiter, from as 8 bytes big-endian] from a DEALER and hands
// each batch to f until the sentinel (seq 2^64−1), f returning false, ctx ending, or
// maxReplayBatches batches. A reply is [empty, topic, seq, payload] or, without the
// delimiter, [topic, seq, payload].
func replayFrom(ctx context.Context, o Options, endpoint string, from uint64, f func(vllmkv.Batch) bool) error {
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
	for n := 0; n < maxReplayBatches; n++ {
		msg, err := zc.RecvMsg()
		if err != nil {
			return err
		}
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		frames := msg.Frames
		if len(frames) == 4 && len(frames[0]) == 0 {
			frames = frames[1:]
		}
		if len(frames) == 3 && len(frames[1]) == 8 && binary.BigEndian.Uint64(frames[1]) == vllmkv.ReplaySentinelSeq {
			return nil
		}
		b, err := vllmkv.DecodeMessage(frames, o.Limits)
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		if !f(b) {
			return nil
		}
	}
	return fmt.Errorf("replay: more than %d batches", maxReplayBatches)
}
