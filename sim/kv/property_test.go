package kv

import (
	"errors"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestRandomWorkloads runs random allocate / import / append / free / lookup sequences on small
// pools with a tiny token alphabet (so prefixes collide and blocks are shared often), checking
// after every step that the bookkeeping holds, that every live sequence's blocks hold exactly its
// tokens, that references add up, and that freeing everything returns every block.
func TestRandomWorkloads(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bs := rapid.IntRange(1, 4).Draw(t, "blockSize")
		total := rapid.IntRange(1, 16).Draw(t, "totalBlocks")
		p := NewPool(total, bs)
		var live []*Seq
		var history [][]uint32 // earlier prompts and sequences, to draw shared prefixes from
		tok := rapid.Uint32Range(0, 2)
		// held is the model of the tagged ids: what Tag reported stored, less what OnUntag
		// reported removed. Each report must be news.
		held := make(map[uint64]bool)
		p.OnUntag(func(ids []uint64) {
			if len(ids) == 0 {
				t.Fatal("OnUntag with no ids")
			}
			for _, id := range ids {
				if !held[id] {
					t.Fatalf("untagged %d, which was not held", id)
				}
				delete(held, id)
			}
		})

		genPrompt := func(t *rapid.T) []uint32 {
			var pr []uint32
			if len(history) > 0 && rapid.Bool().Draw(t, "reusePrefix") {
				src := rapid.SampledFrom(history).Draw(t, "source")
				pr = append(pr, src[:rapid.IntRange(0, len(src)).Draw(t, "prefixLen")]...)
			}
			return append(pr, rapid.SliceOfN(tok, 0, 3*bs).Draw(t, "tail")...)
		}
		// create runs Allocate or Import and checks the outcome against the pool's free count
		// (a request of n blocks fits whenever n blocks are free or evictable) and, for
		// failures, that nothing changed.
		create := func(t *rapid.T, imp bool) {
			prompt := genPrompt(t)
			history = append(history, prompt)
			need := (len(prompt) + bs - 1) / bs
			before := snapshot(p)
			look := p.Lookup(prompt)
			var s *Seq
			var cached int
			var err error
			if imp {
				s, err = p.Import(prompt)
			} else {
				s, cached, err = p.Allocate(prompt)
			}
			if errors.Is(err, ErrNoSpace) {
				if need <= before.Stats.FreeBlocks {
					t.Fatalf("ErrNoSpace for %d blocks with %d free", need, before.Stats.FreeBlocks)
				}
				if diff := diffState(before, snapshot(p)); diff != "" {
					t.Fatalf("failed call changed the pool:\n%s", diff)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(s.Tokens(), prompt) {
				t.Fatalf("tokens %v, want %v", s.Tokens(), prompt)
			}
			after := p.Stats()
			if imp {
				if after.Imported != before.Stats.Imported+uint64(len(prompt)) ||
					after.LookupTokens != before.Stats.LookupTokens || after.HitTokens != before.Stats.HitTokens {
					t.Fatalf("Import stats %+v -> %+v", before.Stats, after)
				}
			} else {
				if cached != look {
					t.Fatalf("Allocate cached %d, Lookup said %d", cached, look)
				}
				if len(prompt) > 0 && cached >= len(prompt) || cached%bs != 0 && cached != len(prompt)-1 {
					t.Fatalf("cached %d of %d tokens (block size %d)", cached, len(prompt), bs)
				}
				if after.LookupTokens != before.Stats.LookupTokens+uint64(len(prompt)) ||
					after.HitTokens != before.Stats.HitTokens+uint64(cached) {
					t.Fatalf("Allocate stats %+v -> %+v", before.Stats, after)
				}
			}
			live = append(live, s)
		}

		t.Repeat(map[string]func(*rapid.T){
			"allocate": func(t *rapid.T) { create(t, false) },
			"import":   func(t *rapid.T) { create(t, true) },
			"append": func(t *rapid.T) {
				if len(live) == 0 {
					return // nothing to act on yet
				}
				s := rapid.SampledFrom(live).Draw(t, "seq")
				n := rapid.IntRange(1, 2*bs).Draw(t, "count")
				for range n {
					before, length := snapshot(p), s.Len()
					err := s.Append(tok.Draw(t, "token"))
					if errors.Is(err, ErrNoSpace) {
						if length%bs != 0 || before.Stats.FreeBlocks != 0 {
							t.Fatalf("ErrNoSpace at len %d with %d free", length, before.Stats.FreeBlocks)
						}
						if diff := diffState(before, snapshot(p)); diff != "" || s.Len() != length {
							t.Fatalf("failed Append changed state:\n%s", diff)
						}
						break
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				history = append(history, slices.Clone(s.Tokens()))
			},
			"tag": func(t *rapid.T) {
				if len(live) == 0 {
					return // nothing to act on yet
				}
				s := rapid.SampledFrom(live).Draw(t, "seq")
				i := rapid.IntRange(-1, s.Blocks()).Draw(t, "block")
				ids := rapid.SliceOfN(rapid.Uint64Range(0, 5), 0, 3).Draw(t, "ids")
				cached := i >= 0 && i < s.Blocks() && p.blocks[s.blocks[i]].cached
				stored := p.Tag(s, i, ids, nil)
				for _, id := range stored {
					if held[id] {
						t.Fatalf("Tag reported %d stored, which was held", id)
					}
					held[id] = true
				}
				for _, id := range ids {
					if cached && !held[id] {
						t.Fatalf("tagged %d on cached block %d, not held", id, i)
					}
				}
			},
			"free": func(t *rapid.T) {
				if len(live) == 0 {
					return // nothing to act on yet
				}
				i := rapid.IntRange(0, len(live)-1).Draw(t, "index")
				s := live[i]
				live = slices.Delete(live, i, i+1)
				if !p.Free(s) {
					t.Fatal("Free of a live sequence returned false")
				}
				if p.Free(s) {
					t.Fatal("second Free returned true")
				}
			},
			"": func(t *rapid.T) {
				if err := p.checkInvariants(); err != nil {
					t.Fatal(err)
				}
				tagged := p.Tagged(nil)
				if len(tagged) != len(held) {
					t.Fatalf("Tagged %v, model holds %v", tagged, held)
				}
				for _, id := range tagged {
					if !held[id] {
						t.Fatalf("Tagged %v, model holds %v", tagged, held)
					}
				}
				refs := make([]int32, len(p.blocks))
				for _, s := range live {
					if err := p.checkSeq(s); err != nil {
						t.Fatal(err)
					}
					for _, id := range s.blocks {
						refs[id]++
					}
				}
				for id, b := range p.blocks {
					if b.ref != refs[id] {
						t.Fatalf("block %d: ref %d, live sequences hold it %d times", id, b.ref, refs[id])
					}
				}
			},
		})

		for _, s := range live {
			p.Free(s)
		}
		if err := p.checkInvariants(); err != nil {
			t.Fatal(err)
		}
		if st := p.Stats(); st.FreeBlocks != st.TotalBlocks || st.ReferencedBlocks != 0 {
			t.Fatalf("after freeing everything: %+v", st)
		}
	})
}
