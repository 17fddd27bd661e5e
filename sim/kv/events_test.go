package kv

import (
	"testing"

	"pgregory.net/rapid"
)

// TestBlockEventsMirrorTheCache: a consumer that applies every OnBlocks report (keyed by the
// engine's hashes, as a router's engine-hash map is) holds exactly the pool's cached blocks
// after each call, and each stored block's tokens are its own. (A run's parent may be gone: a sequence
// whose block duplicated a cached one chains on that one's hash, which may be evicted.)
func TestBlockEventsMirrorTheCache(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bs := rapid.IntRange(1, 4).Draw(t, "blockSize")
		p := NewSeededPool(rapid.IntRange(1, 12).Draw(t, "total"), bs, rapid.Uint64().Draw(t, "seed"))
		mirror := map[uint64][]uint32{} // engine hash → tokens; bounded by the pool's blocks
		p.OnBlocks(func(ev BlockEvents) {
			for _, h := range ev.Removed {
				if _, ok := mirror[h]; !ok {
					t.Fatalf("removed %x, never stored", h)
				}
				delete(mirror, h)
			}
			for _, r := range ev.Stored {
				if len(r.Tokens) != len(r.Hashes)*bs || len(r.Hashes) == 0 {
					t.Fatalf("run of %d hashes with %d tokens", len(r.Hashes), len(r.Tokens))
				}
				for i, h := range r.Hashes {
					if _, dup := mirror[h]; dup {
						t.Fatalf("stored %x twice", h)
					}
					mirror[h] = r.Tokens[i*bs : (i+1)*bs]
				}
			}
		})
		var live []*Seq
		for range rapid.IntRange(1, 40).Draw(t, "steps") {
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				pr := rapid.SliceOfN(rapid.Uint32Range(0, 1), 0, 3*bs).Draw(t, "prompt")
				if s, _, err := p.Allocate(pr); err == nil {
					live = append(live, s)
				}
			case 1:
				if len(live) > 0 {
					_ = live[rapid.IntRange(0, len(live)-1).Draw(t, "seq")].Append(rapid.Uint32Range(0, 1).Draw(t, "tok"))
				}
			case 2:
				if len(live) > 0 {
					i := rapid.IntRange(0, len(live)-1).Draw(t, "free")
					p.Free(live[i])
					live = append(live[:i], live[i+1:]...)
				}
			}
			if len(mirror) != len(p.cache) {
				t.Fatalf("mirror holds %d blocks, the cache %d", len(mirror), len(p.cache))
			}
			for h, id := range p.cache {
				got, ok := mirror[h]
				if !ok {
					t.Fatalf("cached %x never stored", h)
				}
				for i, tk := range p.slab[int(id)*bs : int(id+1)*bs] {
					if got[i] != tk {
						t.Fatalf("block %x tokens %v, cache holds different", h, got)
					}
				}
			}
		}
	})
}

// TestSeededHashes: the seed changes every block's name, so a consumer cannot recompute them.
func TestSeededHashes(t *testing.T) {
	a, b := NewPool(8, 2), NewSeededPool(8, 2, 7)
	var ha, hb []uint64
	a.OnBlocks(func(ev BlockEvents) { ha = append(ha, ev.Stored[0].Hashes...) })
	b.OnBlocks(func(ev BlockEvents) { hb = append(hb, ev.Stored[0].Hashes...) })
	pr := []uint32{1, 2, 3, 4}
	if _, _, err := a.Allocate(pr); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Allocate(pr); err != nil {
		t.Fatal(err)
	}
	if len(ha) != 2 || len(hb) != 2 || ha[0] == hb[0] || ha[1] == hb[1] {
		t.Fatalf("unseeded %x, seeded %x", ha, hb)
	}
	if a.hash(0, pr[:2]) != ha[0] {
		t.Fatal("seed 0 changed the pool's hash")
	}
}
