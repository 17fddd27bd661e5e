package prefixindex

import (
	"slices"
	"testing"
)

// TestHoldersNextNum: NextNum walks the same holders as Next, each with a number unique among
// the workers known at once; a forgotten worker's number is reused by the next new one.
func TestHoldersNextNum(t *testing.T) {
	x := New(0)
	hs := []uint64{1, 2, 3}
	for _, w := range []string{"a", "b", "c"} {
		x.Record(w, hs)
	}
	walk := func() (ids []string, nums map[int32]string) {
		nums = map[int32]string{}
		c := x.Holders(1)
		for num, id, ok := c.NextNum(); ok; num, id, ok = c.NextNum() {
			if prev, dup := nums[num]; dup {
				t.Fatalf("number %d for %s and %s", num, prev, id)
			}
			nums[num] = id
			ids = append(ids, id)
		}
		slices.Sort(ids)
		return ids, nums
	}
	ids, nums := walk()
	var viaNext []string
	c := x.Holders(1)
	for id, ok := c.Next(); ok; id, ok = c.Next() {
		viaNext = append(viaNext, id)
	}
	slices.Sort(viaNext)
	if !slices.Equal(ids, viaNext) || len(ids) != 3 {
		t.Fatalf("NextNum %v, Next %v", ids, viaNext)
	}
	var bNum int32
	for n, id := range nums {
		if id == "b" {
			bNum = n
		}
	}
	x.Forget("b")
	x.Record("d", hs)
	if _, nums = walk(); nums[bNum] != "d" {
		t.Fatalf("after Forget(b), Record(d): numbers %v, want d to reuse b's %d", nums, bNum)
	}
}
