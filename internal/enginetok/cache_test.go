package enginetok

import (
	"bytes"
	"fmt"
	"testing"

	"pgregory.net/rapid"
)

func ids(n int, base uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

func TestCacheExactAndPartial(t *testing.T) {
	c := NewCache(0, 0)
	system := bytes.Repeat([]byte("system\nYou answer briefly. "), 40) // 1,080 bytes
	turn1 := append(append([]byte{}, system...), "user\nhello there\n"...)
	if got, _ := c.Lookup("m", turn1); got != nil {
		t.Fatalf("empty cache answered %v", got)
	}
	c.Store("m", turn1, ids(300, 0))
	if got, exact := c.Lookup("m", turn1); !exact || len(got) != 300 {
		t.Fatalf("exact lookup: %d ids, exact %v", len(got), exact)
	}
	if got, _ := c.Lookup("other", turn1); got != nil {
		t.Fatal("another model's entry answered")
	}
	// The next turn extends turn1: its ids are a prefix of turn1's, short of a margin.
	turn2 := append(append([]byte{}, turn1...), "assistant\nhi\nuser\nand now?\n"...)
	got, exact := c.Lookup("m", turn2)
	shared := len(turn1) / 64 * 64
	if want := PrefixIDs(300, shared, len(turn1)); exact || len(got) != want || want <= 0 {
		t.Fatalf("next turn: %d ids (exact %v), want %d", len(got), exact, want)
	}
	for i, id := range got {
		if id != uint32(i) {
			t.Fatalf("prefix id %d is %d", i, id)
		}
	}
	// Another question on the same system prompt shares the system prompt's depth keys.
	other := append(append([]byte{}, system...), "user\n"+string(bytes.Repeat([]byte("q"), 300))...)
	got, _ = c.Lookup("m", other)
	if len(got) == 0 || len(got) >= 300 {
		t.Fatalf("shared system prompt: %d ids", len(got))
	}
	// A prompt differing in its trailing partial chunk is no exact hit.
	tail := append(append([]byte{}, turn1[:len(turn1)-1]...), '!')
	if _, exact := c.Lookup("m", tail); exact {
		t.Fatal("a different tail was an exact hit")
	}
	// A short prompt (no whole chunk) is found only exactly.
	c.Store("m", []byte("hi"), ids(3, 7))
	if got, exact := c.Lookup("m", []byte("hi")); !exact || len(got) != 3 {
		t.Fatalf("short prompt: %v %v", got, exact)
	}
	if got, _ := c.Lookup("m", []byte("ho")); got != nil {
		t.Fatalf("another short prompt answered %v", got)
	}
	st := c.Stats()
	if st.Hits != 2 || st.Partials != 3 || st.Misses != 3 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPrefixIDs(t *testing.T) {
	for _, tc := range []struct{ n, shared, total, want int }{
		{300, 1024, 1097, 263}, {1000, 1000, 1000, 938}, {10, 64, 128, -11},
		{0, 64, 64, 0}, {10, 0, 64, 0}, {10, 64, 0, 0}, {320, 640, 320, 300},
	} {
		if got := PrefixIDs(tc.n, tc.shared, tc.total); got != tc.want {
			t.Errorf("PrefixIDs(%d,%d,%d) = %d, want %d", tc.n, tc.shared, tc.total, got, tc.want)
		}
	}
}

// TestCacheBounds: entries and ids stay within their bounds, the least recently used entry
// goes first, and an entry larger than the whole bound is not kept.
func TestCacheBounds(t *testing.T) {
	c := NewCache(3, 100)
	p := func(i int) []byte { return []byte(fmt.Sprintf("%0128d", i)) }
	for i := range 3 {
		c.Store("m", p(i), ids(10, 0))
	}
	c.Lookup("m", p(0)) // 0 is now the most recent; 1 the least
	c.Store("m", p(3), ids(10, 0))
	if _, ok := c.Lookup("m", p(1)); ok {
		t.Fatal("the least recently used entry survived")
	}
	for _, i := range []int{0, 2, 3} {
		if _, ok := c.Lookup("m", p(i)); !ok {
			t.Fatalf("entry %d was evicted", i)
		}
	}
	c.Store("m", p(4), ids(95, 0)) // over the ids bound with the others: they go
	st := c.Stats()
	if st.Entries != 1 || st.IDs != 95 || st.Keys != 3 {
		t.Fatalf("after a big entry: %+v", st)
	}
	c.Store("m", p(5), ids(101, 0))
	if _, ok := c.Lookup("m", p(5)); ok || c.Stats().Entries != 1 {
		t.Fatal("an entry over the whole bound was kept")
	}
	c.Store("m", p(4), ids(5, 0)) // a re-render replaces the entry
	if got, _ := c.Lookup("m", p(4)); len(got) != 5 || c.Stats().Entries != 1 {
		t.Fatalf("replaced entry: %d ids, %+v", len(got), c.Stats())
	}
}

// TestCacheProperty: under random stores and lookups the counts add up, every key names a
// live entry, and every exact lookup of a stored, unevicted prompt answers its ids.
func TestCacheProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		maxE := rapid.IntRange(1, 6).Draw(t, "entries")
		c := NewCache(maxE, rapid.IntRange(1, 200).Draw(t, "ids"))
		prompts := [][]byte{}
		for range rapid.IntRange(1, 40).Draw(t, "steps") {
			var pr []byte
			if len(prompts) > 0 && rapid.Bool().Draw(t, "extend") {
				pr = append(pr, rapid.SampledFrom(prompts).Draw(t, "base")...)
			}
			pr = append(pr, bytes.Repeat([]byte{byte(rapid.IntRange('a', 'c').Draw(t, "b"))}, rapid.IntRange(0, 200).Draw(t, "n"))...)
			if rapid.Bool().Draw(t, "store") {
				n := rapid.IntRange(1, 60).Draw(t, "nids")
				c.Store("m", pr, ids(n, 0))
				prompts = append(prompts, pr)
				if got, exact := c.Lookup("m", pr); n <= c.maxIDs && (!exact || len(got) != n) {
					t.Fatalf("just stored %d ids, lookup %d exact %v", n, len(got), exact)
				}
			} else if got, _ := c.Lookup("m", pr); len(got) > 60 {
				t.Fatalf("%d ids", len(got))
			}
			live, n, sum := map[*entry]bool{}, 0, 0
			for e := c.head; e != nil; e = e.next {
				live[e] = true
				n++
				sum += len(e.ids)
				if e.next == nil && c.tail != e {
					t.Fatal("tail is not the last entry")
				}
			}
			if n != c.count || sum != c.ids || n > maxE || sum > c.maxIDs {
				t.Fatalf("count %d/%d ids %d/%d", n, c.count, sum, c.ids)
			}
			for _, e := range c.byKey {
				if !live[e] {
					t.Fatal("a key names an evicted entry")
				}
			}
		}
	})
}

// TestCachePartialDepths: a prompt sharing exactly 1, 2, 4 or 3 whole chunks with a longer
// entry gets the proportional ids of that depth (chunk 1, 2 and 4 carry depth keys; 3 does
// not, so it falls to 2); a share too short for any id is a miss.
func TestCachePartialDepths(t *testing.T) {
	c := NewCache(0, 0)
	base := bytes.Repeat([]byte("0123456789abcdef"), 40) // 640 bytes, 10 chunks
	c.Store("m", base, ids(1000, 0))
	for _, tc := range []struct{ shared, depthBytes int }{{64, 64}, {128, 128}, {192, 128}, {256, 256}} {
		pr := append(append([]byte{}, base[:tc.shared]...), bytes.Repeat([]byte("z"), 100)...)
		got, exact := c.Lookup("m", pr)
		if want := PrefixIDs(1000, tc.depthBytes, 640); exact || len(got) != want {
			t.Fatalf("sharing %d bytes: %d ids, want %d", tc.shared, len(got), want)
		}
	}
	small := NewCache(0, 0)
	small.Store("m", base[:128], ids(32, 0)) // a 64-byte share is worth 16 ids, all margin
	if got, _ := small.Lookup("m", append(append([]byte{}, base[:64]...), bytes.Repeat([]byte("z"), 70)...)); got != nil {
		t.Fatalf("a share worth no id answered %d ids", len(got))
	}
}
