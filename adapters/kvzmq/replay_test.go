package kvzmq

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tlgw/tlgw/internal/vllmkv"
)

// TestReplayFromBound: over a loopback replay endpoint, a replay of exactly max batches (then
// the sentinel) is read whole; one more batch fails it; the request's from is what the
// endpoint answers from; f returning false ends the replay early without an error.
func TestReplayFromBound(t *testing.T) {
	topic := vllmkv.FormatTopic("127.0.0.1:8001", "m")
	held := func(n int) map[uint64][]vllmkv.Event {
		m := map[uint64][]vllmkv.Event{}
		for seq := 1; seq <= n; seq++ {
			m[uint64(seq)] = []vllmkv.Event{root(uint64(seq))}
		}
		return m
	}
	var o Options
	o.defaults()
	run := func(ep string, from uint64, stopAt uint64) ([]uint64, error) {
		var got []uint64
		err := replayFrom(context.Background(), o, ep, from, 3, func(b vllmkv.Batch) bool {
			got = append(got, b.Seq)
			if b.Topic != topic || len(b.Events) != 1 {
				t.Errorf("batch %+v", b)
			}
			return b.Seq != stopAt
		})
		return got, err
	}

	three := replayServer(t, topic, held(3), shapeTopic)
	if got, err := run(three, 1, 0); err != nil || !cmp.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("three batches, max 3: %v, %v", got, err)
	}
	if got, err := run(three, 2, 0); err != nil || !cmp.Equal(got, []uint64{2, 3}) {
		t.Fatalf("from 2: %v, %v", got, err)
	}
	four := replayServer(t, topic, held(4), shapeTopic)
	if got, err := run(four, 1, 0); err == nil || !strings.Contains(err.Error(), "more than 3 batches") || !cmp.Equal(got, []uint64{1, 2, 3}) {
		t.Fatalf("four batches, max 3: %v, %v", got, err)
	}
	if got, err := run(four, 1, 2); err != nil || !cmp.Equal(got, []uint64{1, 2}) {
		t.Fatalf("stopped at 2: %v, %v", got, err)
	}
}
