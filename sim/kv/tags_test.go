package kv

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestTagsFollowTheCache is the worked example of tags.go: an id is stored when the first cached
// block carries it and removed when the last carrying block is evicted; private and partial
// blocks carry nothing.
func TestTagsFollowTheCache(t *testing.T) {
	p := NewPool(4, 2)
	var removed [][]uint64
	p.OnUntag(func(ids []uint64) { removed = append(removed, slices.Clone(ids)) })

	a, _ := mustAlloc(t, p, toks(1, 5)) // blocks [1 2] [3 4] [5]: two cached, one partial
	if got := p.Tag(a, 0, []uint64{10, 11}, nil); !cmp.Equal(got, []uint64{10, 11}) {
		t.Fatalf("first Tag stored %v, want [10 11]", got)
	}
	if got := p.Tag(a, 0, []uint64{11, 10}, nil); len(got) != 0 {
		t.Fatalf("Tag of carried ids stored %v, want nothing", got)
	}
	if got := p.Tag(a, 2, []uint64{12}, nil); len(got) != 0 {
		t.Fatalf("Tag of the partial block stored %v, want nothing", got)
	}
	if got := p.Tag(a, 3, []uint64{12}, nil); len(got) != 0 {
		t.Fatalf("Tag out of range stored %v, want nothing", got)
	}
	// b shares block 0 (already carries 10) and tags 10 and 12 on its own block 1.
	b, _ := mustAlloc(t, p, concat(toks(1, 2), toks(7, 2)))
	if got := p.Tag(b, 1, []uint64{10, 12}, nil); !cmp.Equal(got, []uint64{12}) {
		t.Fatalf("Tag on b stored %v, want [12]", got)
	}
	check(t, p, a, b)
	held := p.Tagged(nil)
	slices.Sort(held)
	if !cmp.Equal(held, []uint64{10, 11, 12}) {
		t.Fatalf("Tagged %v, want [10 11 12]", held)
	}

	p.Free(b) // b's block 1 becomes evictable; block 0 is still a's
	p.Free(a) // LRU: b1, a2 (freed: private), a1, a0
	c, _ := mustAlloc(t, p, toks(20, 4))
	// c took the free partial block and evicted b's block 1 (12 gone, 10 still on a's block 0).
	if diff := cmp.Diff([][]uint64{{12}}, removed); diff != "" {
		t.Fatalf("removed (-want +got):\n%s", diff)
	}
	p.Free(c)
	mustAlloc(t, p, toks(30, 8)) // evicts everything
	got := slices.Concat(removed...)
	slices.Sort(got)
	if !cmp.Equal(got, []uint64{10, 11, 12}) {
		t.Fatalf("removed %v over all, want each of 10 11 12 once", removed)
	}
	if held := p.Tagged(nil); len(held) != 0 {
		t.Fatalf("Tagged %v after evicting everything", held)
	}
	check(t, p)
}

// TestTagPrivateDuplicateCarriesNothing: a block that duplicates a registered one is private to
// its sequence; a Tag on it reports nothing.
func TestTagPrivateDuplicateCarriesNothing(t *testing.T) {
	p := NewPool(8, 2)
	a, _ := mustAlloc(t, p, toks(1, 2))
	b, _ := mustAlloc(t, p, toks(1, 1))
	if err := b.Append(2); err != nil { // fills [1 2] again: a duplicate, private
		t.Fatal(err)
	}
	if got := p.Tag(b, 0, []uint64{5}, nil); len(got) != 0 {
		t.Fatalf("Tag on a private duplicate stored %v", got)
	}
	if got := p.Tag(a, 0, []uint64{5}, nil); !cmp.Equal(got, []uint64{5}) {
		t.Fatalf("Tag on the registered block stored %v, want [5]", got)
	}
	check(t, p, a, b)
}
