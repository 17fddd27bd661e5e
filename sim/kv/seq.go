package kv

// Seq is one sequence's view of the pool: its tokens and the blocks that hold their KV. It is
// created by Pool.Allocate or Pool.Import and ends with Pool.Free. Like the pool, it is not safe
// for concurrent use.
type Seq struct {
	pool     *Pool
	tokens   []uint32
	blocks   []int32
	lastHash uint64 // chained hash of the last full block (rootHash if none)
	freed    bool
}

// Len is the number of tokens in the sequence (prompt plus appended).
func (s *Seq) Len() int { return len(s.tokens) }

// Blocks is the number of blocks the sequence holds (0 once freed).
func (s *Seq) Blocks() int { return len(s.blocks) }

// Tokens returns the sequence's tokens. The slice aliases the sequence's storage: the caller must
// not modify it. It stays readable after Free.
func (s *Seq) Tokens() []uint32 { return s.tokens[:len(s.tokens):len(s.tokens)] }

// Freed reports whether Pool.Free has released the sequence.
func (s *Seq) Freed() bool { return s.freed }

// Append adds one generated token. Crossing a block boundary takes a new block (from the free
// list, else by eviction); if none can be had it returns ErrNoSpace and the sequence is unchanged,
// so the caller may retry after other sequences free. A block that Append fills is registered in
// the prefix cache (unless an identical block already is). Append on a freed sequence returns
// ErrFreed.
func (s *Seq) Append(tok uint32) error {
	if s.freed {
		return ErrFreed
	}
	p := s.pool
	bs := p.blockSize
	off := len(s.tokens) % bs
	if off == 0 {
		if len(p.free)+p.lruLen == 0 {
			return ErrNoSpace
		}
		s.blocks = append(s.blocks, p.take())
		p.flushUntag()
		p.flushBlocks()
	}
	id := s.blocks[len(s.blocks)-1]
	p.slab[int(id)*bs+off] = tok
	s.tokens = append(s.tokens, tok)
	if off == bs-1 {
		chunk := s.tokens[len(s.tokens)-bs:]
		h := p.hash(s.lastHash, chunk)
		p.register(id, h, s.lastHash)
		s.lastHash = h
		p.flushBlocks()
	}
	return nil
}
