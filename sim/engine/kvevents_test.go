package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	kvv1 "github.com/tlgw/tlgw/contracts/tl/kv/v1"
	"github.com/tlgw/tlgw/internal/oai"
	"github.com/tlgw/tlgw/internal/prefixindex"
	"github.com/tlgw/tlgw/sim/sampler"
)

// kvWatch is a KvEvents subscriber: it checks that seq is consecutive on its stream and hands
// out events one by one, waiting at most 5 s for each.
type kvWatch struct {
	t      *testing.T
	events chan *kvv1.KvEvent
	errc   chan error
	seq    uint64 // the last event's seq
	seen   bool
}

func watchKV(t *testing.T, e *Engine) *kvWatch {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := kvv1.NewKvEventsClient(dial(t, e.GRPCAddr)).Subscribe(ctx, &kvv1.SubscribeRequest{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	w := &kvWatch{t: t, events: make(chan *kvv1.KvEvent, 64), errc: make(chan error, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ev, err := stream.Recv()
			if err != nil {
				w.errc <- err
				return
			}
			select {
			case w.events <- ev:
			case <-ctx.Done():
				return
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

func (w *kvWatch) next() *kvv1.KvEvent {
	w.t.Helper()
	select {
	case ev := <-w.events:
		if w.seen && ev.GetSeq() != w.seq+1 {
			w.t.Fatalf("event seq %d after %d", ev.GetSeq(), w.seq)
		}
		w.seq, w.seen = ev.GetSeq(), true
		return ev
	case err := <-w.errc:
		w.t.Fatalf("the stream ended: %v", err)
	case <-time.After(5 * time.Second):
		w.t.Fatal("no KvEvent within 5 s")
	}
	return nil
}

// expect reads the next event and checks its kind and ids (in order).
func (w *kvWatch) expect(kind kvv1.KvEvent_Kind, ids []uint64) *kvv1.KvEvent {
	w.t.Helper()
	ev := w.next()
	if ev.GetKind() != kind || !slices.Equal(ev.GetBlockIds(), ids) {
		w.t.Fatalf("event %v %v, want %v %v", ev.GetKind(), ev.GetBlockIds(), kind, ids)
	}
	return ev
}

// removedUntil reads REMOVED events until their ids add up to want (in any order).
func (w *kvWatch) removedUntil(want []uint64) {
	w.t.Helper()
	var got []uint64
	for len(got) < len(want) {
		ev := w.next()
		if ev.GetKind() != kvv1.KvEvent_REMOVED {
			w.t.Fatalf("event %v %v while %v of %v were removed", ev.GetKind(), ev.GetBlockIds(), got, want)
		}
		got = append(got, ev.GetBlockIds()...)
	}
	if diff := cmp.Diff(sorted(want), sorted(got)); diff != "" {
		w.t.Fatalf("removed (-want +got):\n%s", diff)
	}
}

func sorted(ids []uint64) []uint64 {
	out := slices.Clone(ids)
	slices.Sort(out)
	return out
}

// wantStored is the definition the engine must meet, computed without its code: the gateway's
// chunk ids of body (oai.RenderPrompt, prefixindex.Hashes) whose last byte falls in the engine
// prompt text covered by the prompt's full KV blocks. For chat the engine's text is
// sampler.RenderChat: message i starts 4·i bytes later than in the gateway's render, and its
// role 2 bytes later still ("<|"), everything after the role 4 ("<|" and "|>").
func wantStored(t *testing.T, kind oai.Kind, body string, bs int) (stored, all []uint64) {
	t.Helper()
	all = prefixindex.Hashes(nil, oai.RenderPrompt(kind, []byte(body), 1<<20))
	text, at := engineText(t, kind, body)
	toks := sampler.Tokenize(text)
	covered := len(sampler.Detokenize(toks[:len(toks)/bs*bs]))
	n := 0
	for n < len(all) && at((n+1)*prefixindex.ChunkBytes-1) < covered {
		n++
	}
	return all[:n], all
}

// engineText returns the engine's prompt text for body and where byte g of the gateway's render
// lies in it.
func engineText(t *testing.T, kind oai.Kind, body string) (string, func(g int) int) {
	t.Helper()
	var w struct {
		Prompt   json.RawMessage
		Messages []struct {
			Role    string
			Content json.RawMessage
		}
	}
	if err := json.Unmarshal([]byte(body), &w); err != nil {
		t.Fatal(err)
	}
	if kind != oai.Chat {
		var prompt string
		if json.Unmarshal(w.Prompt, &prompt) != nil { // an array of one string
			var one []string
			if err := json.Unmarshal(w.Prompt, &one); err != nil || len(one) != 1 {
				t.Fatalf("prompt %s", w.Prompt)
			}
			prompt = one[0]
		}
		return prompt, func(g int) int { return g }
	}
	var msgs []sampler.Message
	for _, m := range w.Messages {
		var content string
		if json.Unmarshal(m.Content, &content) != nil { // text parts
			var parts []struct{ Type, Text string }
			if err := json.Unmarshal(m.Content, &parts); err != nil {
				t.Fatal(err)
			}
			for _, p := range parts {
				if p.Type == "text" {
					content += p.Text
				}
			}
		}
		msgs = append(msgs, sampler.Message{Role: m.Role, Content: content})
	}
	return sampler.RenderChat(msgs), func(g int) int {
		start := 0
		for i, m := range msgs {
			n := len(m.Role) + len(m.Content) + 2
			if g < start+n {
				if g-start < len(m.Role) {
					return g + 4*i + 2
				}
				return g + 4*i + 4
			}
			start += n
		}
		t.Fatalf("byte %d past the render", g)
		return 0
	}
}

// TestPromptChunksMapping: for bodies with escapes, non-ASCII text, content parts, null and
// empty contents and many messages, every chunk of the gateway's render is returned, in order,
// with the engine token that covers its last byte (found here by walking the token texts).
func TestPromptChunksMapping(t *testing.T) {
	long := strings.Repeat(`Lorem ipsum dolor sit amet, caf\u00e9 \\ \\n \"q\" 12345 ;`, 8)
	cases := []struct {
		name string
		kind oai.Kind
		body string
	}{
		{"completions string", oai.Completions, `{"model":"smol","prompt":"` + long + `"}`},
		{"completions array of one", oai.Completions, `{"model":"smol","prompt":["` + long + `"]}`},
		{"chat", oai.Chat, `{"model":"smol","messages":[{"role":"system","content":"` + long + `"},` +
			`{"role":"user","content":null},{"role":"assistant","content":""},` +
			`{"role":"us\u00e9r","content":[{"type":"text","text":"` + long + `"},{"type":"text","text":"x"}]},` +
			`{"role":"user","content":"` + long + `"}]}`},
		{"chat, many short messages", oai.Chat, `{"model":"smol","messages":[` +
			strings.TrimSuffix(strings.Repeat(`{"role":"u","content":"hi"},`, 40), ",") + `]}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if n := checkPromptChunks(t, c.kind, c.body); n < 3 {
				t.Fatalf("%d chunks, want at least 3", n)
			}
		})
	}
}

// checkPromptChunks checks promptChunks on one body against the gateway's render: every chunk,
// in order, each with the engine token covering its last byte; it returns the chunk count.
func checkPromptChunks(t *testing.T, kind oai.Kind, body string) int {
	t.Helper()
	req, err := parseRequest([]byte(body), kind == oai.Chat, only("smol"))
	if err != nil {
		t.Fatal(err)
	}
	prompt := sampler.Tokenize(req.prompt)
	got := promptChunks(req, []byte(body), prompt)
	all := prefixindex.Hashes(nil, oai.RenderPrompt(kind, []byte(body), 1<<20))
	if len(got) != len(all) {
		t.Fatalf("%d chunks, want all %d", len(got), len(all))
	}
	text, at := engineText(t, kind, body)
	if text != req.prompt {
		t.Fatalf("test's engine text differs from the engine's")
	}
	for i, ch := range got {
		e := at((i+1)*prefixindex.ChunkBytes - 1)
		start := len(sampler.Detokenize(prompt[:ch.token]))
		end := start + len(sampler.TokenText(prompt[ch.token]))
		if ch.id != all[i] || e < start || e >= end {
			t.Fatalf("chunk %d: id %x token %d (bytes %d-%d), want id %x and a token covering byte %d",
				i, ch.id, ch.token, start, end, all[i], e)
		}
	}
	return len(got)
}

// TestPromptChunksAtTheEdges: renders of one byte short of a chunk, exactly one and exactly two
// chunks, and chat messages whose render ends exactly at a chunk's last byte or one byte either
// side of it.
func TestPromptChunksAtTheEdges(t *testing.T) {
	for _, n := range []int{63, 64, 65, 127, 128} {
		body := `{"model":"smol","prompt":"` + strings.Repeat("a", n) + `"}`
		if got := checkPromptChunks(t, oai.Completions, body); got != n/prefixindex.ChunkBytes {
			t.Fatalf("a prompt of %d bytes: %d chunks, want %d", n, got, n/prefixindex.ChunkBytes)
		}
	}
	// "system\n" + content + "\n" is 8 + len(content) bytes of the render.
	for _, n := range []int{55, 56, 57} {
		body := `{"model":"smol","messages":[{"role":"system","content":"` + strings.Repeat("s", n) +
			`"},{"role":"user","content":"` + strings.Repeat("u", 100) + `"}]}`
		if got := checkPromptChunks(t, oai.Chat, body); got != (8+n+5+101)/prefixindex.ChunkBytes {
			t.Fatalf("a system message of %d bytes: %d chunks", n, got)
		}
	}
}

// FuzzPromptChunks: whatever the body, promptChunks returns a prefix of the gateway's chunk ids
// with tokens in order inside the prompt, and never panics.
func FuzzPromptChunks(f *testing.F) {
	f.Add(true, `{"model":"smol","messages":[{"role":"user","content":"`+strings.Repeat("abc ", 40)+`"}]}`)
	f.Add(false, `{"model":"smol","prompt":"`+strings.Repeat(`x\ud800y `, 30)+`"}`)
	f.Add(false, `{"model":"smol","prompt":"a","prompt":"`+strings.Repeat("z", 200)+`"}`)
	f.Fuzz(func(t *testing.T, chat bool, body string) {
		req, err := parseRequest([]byte(body), chat, only("smol"))
		if err != nil {
			return
		}
		kind := oai.Completions
		if chat {
			kind = oai.Chat
		}
		prompt := sampler.Tokenize(req.prompt)
		got := promptChunks(req, []byte(body), prompt)
		all := prefixindex.Hashes(nil, oai.RenderPrompt(kind, []byte(body), len(body)))
		if len(got) > len(all) {
			t.Fatalf("%d chunks of %d", len(got), len(all))
		}
		for i, ch := range got {
			if ch.id != all[i] || ch.token >= len(prompt) || i > 0 && ch.token < got[i-1].token {
				t.Fatalf("chunk %d: %+v", i, ch)
			}
		}
	})
}

func completionsBody(prompt string) string {
	b, _ := json.Marshal(map[string]any{"model": "smol", "prompt": prompt, "max_tokens": 1, "seed": 1})
	return string(b)
}

const story = "The quick brown fox jumps over the lazy dog, and then it runs back again. " +
	"A caf\u00e9 \"quote\" sits on the corner of the street where nobody goes at night; " +
	"numbers 1234567890 and symbols #$%& are tokenized in pieces of four bytes at most. " +
	"The end of the story is near, so the last words are written here for the test."

// TestKVEventsStoredCompletionsAndChat: a completions and a chat request each store exactly the
// gateway's chunk ids that the engine's cached blocks cover (for these prompts: every full
// chunk); the same request again stores nothing new (the next event is the third request's).
func TestKVEventsStoredCompletionsAndChat(t *testing.T) {
	noLeaks(t)
	e := start(t, Config{})
	w := watchKV(t, e)
	if ev := w.expect(kvv1.KvEvent_CLEARED, nil); ev.GetSeq() != 0 {
		t.Fatalf("a new engine's CLEARED has seq %d, want 0", ev.GetSeq())
	}

	comp := completionsBody(story)
	stored, all := wantStored(t, oai.Completions, comp, 16)
	if len(all) < 4 || len(stored) != len(all) {
		t.Fatalf("test premise: %d of %d chunks stored, want all of at least 4", len(stored), len(all))
	}
	if resp, b := post(t, e, "/v1/completions", comp); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	w.expect(kvv1.KvEvent_STORED, stored)

	chat := `{"model":"smol","max_tokens":1,"seed":1,"messages":[` +
		`{"role":"system","content":"You are a helpful assistant who answers briefly."},` +
		`{"role":"user","content":[{"type":"text","text":"` + strings.ReplaceAll(story, `"`, `\"`) + `"},{"type":"image_url","image_url":{"url":"x"}}]}]}`
	stored, all = wantStored(t, oai.Chat, chat, 16)
	if len(all) < 5 || len(stored) != len(all) {
		t.Fatalf("test premise: %d of %d chunks stored, want all of at least 5", len(stored), len(all))
	}
	if resp, b := post(t, e, "/v1/chat/completions", chat); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	w.expect(kvv1.KvEvent_STORED, stored)

	// Again: every id is held already. The next event is the third request's.
	if resp, b := post(t, e, "/v1/chat/completions", chat); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	third := completionsBody("Another prompt entirely, " + story)
	stored, _ = wantStored(t, oai.Completions, third, 16)
	if resp, b := post(t, e, "/v1/completions", third); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	w.expect(kvv1.KvEvent_STORED, stored)
}

// TestKVEventsPartialBlockNotStored: a chunk whose last byte lies in the prompt's partial last
// block is not reported; once a longer prompt fills that block, it is.
func TestKVEventsPartialBlockNotStored(t *testing.T) {
	e := start(t, Config{})
	w := watchKV(t, e)
	w.expect(kvv1.KvEvent_CLEARED, nil)
	// 20 one-byte tokens and 27 four-byte ones: 128 bytes (two chunks) in 47 tokens. Chunk 0
	// ends in token 30 (block 1, full), chunk 1 in token 46 (block 2, 15 of 16 tokens).
	short := completionsBody(strings.Repeat(".", 20) + strings.Repeat("1357", 27))
	stored, all := wantStored(t, oai.Completions, short, 16)
	if len(all) != 2 || len(stored) != 1 {
		t.Fatalf("test premise: %d of %d chunks", len(stored), len(all))
	}
	if resp, b := post(t, e, "/v1/completions", short); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	w.expect(kvv1.KvEvent_STORED, stored)
	// One more token fills block 2: chunk 1 is stored now.
	long := completionsBody(strings.Repeat(".", 20) + strings.Repeat("1357", 27) + "9")
	stored, all = wantStored(t, oai.Completions, long, 16)
	if len(all) != 2 || len(stored) != 2 {
		t.Fatalf("test premise: %d of %d chunks", len(stored), len(all))
	}
	if resp, b := post(t, e, "/v1/completions", long); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	w.expect(kvv1.KvEvent_STORED, stored[1:])
}

// TestKVEventsEvictionRemoves: with 8 blocks of 16 tokens, a 120-token prompt needs every block,
// so the 70-token prompt before it (4 cached blocks, 4 chunks) is evicted: REMOVED of its 4
// chunks, then STORED of the new prompt's 7.
func TestKVEventsEvictionRemoves(t *testing.T) {
	noLeaks(t)
	e := start(t, Config{KVBlocks: 8, BlockSize: 16})
	w := watchKV(t, e)
	w.expect(kvv1.KvEvent_CLEARED, nil)
	a := completionsBody(strings.Repeat("1234", 70))
	storedA, _ := wantStored(t, oai.Completions, a, 16)
	if len(storedA) != 4 {
		t.Fatalf("test premise: %d chunks", len(storedA))
	}
	if resp, b := post(t, e, "/v1/completions", a); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	w.expect(kvv1.KvEvent_STORED, storedA)

	b := completionsBody(strings.Repeat("5678", 120))
	storedB, _ := wantStored(t, oai.Completions, b, 16)
	if len(storedB) != 7 {
		t.Fatalf("test premise: %d chunks", len(storedB))
	}
	if resp, body := post(t, e, "/v1/completions", b); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	w.removedUntil(storedA)
	w.expect(kvv1.KvEvent_STORED, storedB)
}

// TestKVEventsSnapshot: a new subscriber gets CLEARED at the engine's sequence number and a
// STORED of everything held, then the live events, numbered on from its snapshot.
func TestKVEventsSnapshot(t *testing.T) {
	noLeaks(t)
	e := start(t, Config{})
	w1 := watchKV(t, e)
	w1.expect(kvv1.KvEvent_CLEARED, nil)
	var held []uint64
	for _, p := range []string{story, "Second: " + story} {
		body := completionsBody(p)
		stored, _ := wantStored(t, oai.Completions, body, 16)
		if resp, b := post(t, e, "/v1/completions", body); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		w1.expect(kvv1.KvEvent_STORED, stored)
		held = append(held, stored...)
	}

	w2 := watchKV(t, e)
	if ev := w2.expect(kvv1.KvEvent_CLEARED, nil); ev.GetSeq() != w1.seq {
		t.Fatalf("CLEARED seq %d, want the engine's %d", ev.GetSeq(), w1.seq)
	}
	w2.expect(kvv1.KvEvent_STORED, sorted(held))

	body := completionsBody("Third: " + story)
	stored, _ := wantStored(t, oai.Completions, body, 16)
	if resp, b := post(t, e, "/v1/completions", body); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if ev := w1.expect(kvv1.KvEvent_STORED, stored); ev.GetSeq() != 3 {
		t.Fatalf("first stream: seq %d, want 3", ev.GetSeq())
	}
	if ev := w2.expect(kvv1.KvEvent_STORED, stored); ev.GetSeq() != 4 {
		t.Fatalf("second stream: seq %d, want 4 (after its snapshot)", ev.GetSeq())
	}
}

// TestKVEventsSnapshotBatches: a snapshot of more than 4096 ids comes in events of at most 4096.
func TestKVEventsSnapshotBatches(t *testing.T) {
	h := newKVEvents()
	h.publish(kvv1.KvEvent_STORED, make([]uint64, 5000)) // two live events: seq 1 and 2
	held := make([]uint64, 2*maxIDsPerEvent+1)
	sub, snap, err := h.subscribe(held)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, ev := range snap {
		got = append(got, fmt.Sprintf("%d %v %d", ev.GetSeq(), ev.GetKind(), len(ev.GetBlockIds())))
	}
	want := []string{"2 CLEARED 0", "3 STORED 4096", "4 STORED 4096", "5 STORED 1"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("snapshot (-want +got):\n%s", diff)
	}
	h.publish(kvv1.KvEvent_REMOVED, []uint64{7})
	if ev := <-sub.ch; ev.GetSeq()+sub.off != 6 {
		t.Fatalf("first live event on the stream: seq %d, want 6", ev.GetSeq()+sub.off)
	}
}

// TestKVEventsSlowSubscriberDropped: a subscriber that reads nothing is cut once its buffer is
// full, without the publisher ever waiting; it then reads what was sent and ResourceExhausted,
// and a new subscription starts afresh.
func TestKVEventsSlowSubscriberDropped(t *testing.T) {
	noLeaks(t)
	e := start(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	slow, err := kvv1.NewKvEventsClient(dial(t, e.GRPCAddr)).Subscribe(ctx, &kvv1.SubscribeRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := slow.Recv(); err != nil || ev.GetKind() != kvv1.KvEvent_CLEARED {
		t.Fatalf("first event %v, %v", ev, err)
	}
	subs := func() int {
		e.kvev.mu.Lock()
		defer e.kvev.mu.Unlock()
		return len(e.kvev.subs)
	}
	// Events of 4096 large ids (about 40 KB) fill the transport's windows, then the buffer.
	ids := make([]uint64, maxIDsPerEvent)
	for i := range ids {
		ids[i] = ^uint64(i)
	}
	published := make(chan int)
	go func() {
		n := 0
		for ; n < 10000 && subs() > 0; n++ {
			e.kvev.publish(kvv1.KvEvent_STORED, ids)
		}
		published <- n
	}()
	var n int
	select {
	case n = <-published:
	case <-time.After(10 * time.Second):
		t.Fatal("publishing blocked on a slow subscriber")
	}
	if subs() != 0 {
		t.Fatalf("the slow subscriber is still subscribed after %d events", n)
	}
	for {
		_, err := slow.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("the slow stream ended with %v, want ResourceExhausted", err)
		}
		break
	}
	w := watchKV(t, e)
	if ev := w.expect(kvv1.KvEvent_CLEARED, nil); ev.GetSeq() != uint64(n) {
		t.Fatalf("resubscribed: CLEARED seq %d, want %d", ev.GetSeq(), n)
	}
}

// TestKVEventsSubscriberLimit: a 17th subscriber is refused with ResourceExhausted; when one
// leaves, a new one is accepted.
func TestKVEventsSubscriberLimit(t *testing.T) {
	noLeaks(t)
	e := start(t, Config{})
	client := kvv1.NewKvEventsClient(dial(t, e.GRPCAddr))
	cancels := make([]context.CancelFunc, maxKVSubscribers)
	for i := range cancels {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		defer cancel()
		s, err := client.Subscribe(ctx, &kvv1.SubscribeRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := client.Subscribe(ctx, &kvv1.SubscribeRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("17th subscriber: %v, want ResourceExhausted", err)
	}
	cancels[0]()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := client.Subscribe(ctx, &kvv1.SubscribeRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		cancel()
		if err == nil {
			break
		}
		if status.Code(err) != codes.ResourceExhausted || time.Now().After(deadline) {
			t.Fatalf("after one left: %v", err)
		}
	}
}

// TestKVEventsEndOnClose: Close ends every subscription (Unavailable) and leaks nothing.
func TestKVEventsEndOnClose(t *testing.T) {
	noLeaks(t)
	e, err := Start(Config{ID: "e1", Model: "smol"})
	if err != nil {
		t.Fatal(err)
	}
	w := watchKV(t, e)
	w.expect(kvv1.KvEvent_CLEARED, nil)
	e.Close()
	select {
	case err := <-w.errc:
		if c := status.Code(err); c != codes.Unavailable && !errors.Is(err, context.Canceled) {
			t.Fatalf("stream ended with %v, want Unavailable", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stream outlived Close")
	}
}

// TestKVEventsDisaggregated: a decode engine that resumes a request from pushed KV (with the
// request's body) stores its chunks like a unified one; the prefill engine, which sees only
// token ids, reports none. The prefill's STORED-free stream is checked by a later barrier event.
func TestKVEventsDisaggregated(t *testing.T) {
	x := startPD(t, Config{})
	wp, wd := watchKV(t, x.p), watchKV(t, x.d)
	wp.expect(kvv1.KvEvent_CLEARED, nil)
	wd.expect(kvv1.KvEvent_CLEARED, nil)
	body := map[string]any{"model": "smol", "messages": []map[string]any{{"role": "user", "content": story}}, "max_tokens": 4, "seed": 3}
	stored, all := wantStored(t, oai.Chat, mustJSON(body), 16)
	if len(stored) < 3 {
		t.Fatalf("test premise: %d of %d chunks", len(stored), len(all))
	}
	pre := x.prefill(t, body)
	if resp, b := post(t, x.d, "/v1/chat/completions", mustJSON(body), "X-TL-KV-Handle", pre.GetHandle().GetHandleId()); resp.StatusCode != 200 {
		t.Fatalf("decode: %d %s", resp.StatusCode, b)
	}
	wd.expect(kvv1.KvEvent_STORED, stored)

	barrier := completionsBody(story)
	want, _ := wantStored(t, oai.Completions, barrier, 16)
	if resp, b := post(t, x.p, "/v1/completions", barrier); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	wp.expect(kvv1.KvEvent_STORED, want)
}

// TestWarmupBodyWarmsItsRequest: a gateway's prefix warm-up (oai.WarmupBody: the request's
// leading messages cut to the prefix a holder matched, one token) fills the engine's cache
// with the blocks the request itself needs: the engine reports the request's own chunk ids for
// all but the last two chunks of the warmed prefix (the block the warm-up ends in, as the
// router's warm-up slack allows), and the request that follows finds them cached.
func TestWarmupBodyWarmsItsRequest(t *testing.T) {
	noLeaks(t)
	e := start(t, Config{})
	w := watchKV(t, e)
	w.expect(kvv1.KvEvent_CLEARED, nil)
	sys := strings.Repeat(story, 3)
	chat := `{"model":"smol","max_tokens":1,"seed":1,"messages":[` +
		`{"role":"system","content":"` + strings.ReplaceAll(sys, `"`, `\"`) + `"},` +
		`{"role":"user","content":"Which street, and when?"}]}`
	all := prefixindex.Hashes(nil, oai.RenderPrompt(oai.Chat, []byte(chat), 1<<20))
	// The chunks that lie within the system message: what another request under the same
	// system prompt matched on its holder.
	matched := len(oai.RenderPrompt(oai.Chat, []byte(`{"model":"m","messages":[{"role":"system","content":"`+
		strings.ReplaceAll(sys, `"`, `\"`)+`"}]}`), 1<<20)) / prefixindex.ChunkBytes
	warm, ok := oai.WarmupBody(oai.Chat, []byte(chat), matched*prefixindex.ChunkBytes, "smol")
	if !ok || matched < 8 {
		t.Fatalf("test premise: a warm-up of %d chunks (%v)", matched, ok)
	}
	if resp, b := post(t, e, "/v1/chat/completions", string(warm)); resp.StatusCode != 200 {
		t.Fatalf("the warm-up: %d %s", resp.StatusCode, b)
	}
	ev := w.next()
	got := ev.GetBlockIds()
	if ev.GetKind() != kvv1.KvEvent_STORED || len(got) < matched-2 || len(got) > matched || !slices.Equal(got, all[:len(got)]) {
		t.Fatalf("the warm-up stored %v %x, want the request's first %d or more of %x", ev.GetKind(), got, matched-2, all[:matched])
	}
	before := e.sched.status().kv.HitTokens
	if resp, b := post(t, e, "/v1/chat/completions", chat); resp.StatusCode != 200 {
		t.Fatalf("the request: %d %s", resp.StatusCode, b)
	}
	// Each chunk is 64 bytes of text, at least 16 tokens of at most 4 bytes: the request finds
	// at least the blocks under the chunks the warm-up stored (whole blocks of 16).
	if hit := e.sched.status().kv.HitTokens - before; hit < uint64(16*(len(got)-1)) {
		t.Fatalf("the request found %d tokens cached after a warm-up of %d chunks", hit, len(got))
	}
}
