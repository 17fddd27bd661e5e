package sampler

import "math/bits"

// pcgMultiplier is the 64-bit LCG multiplier of the PCG family's reference
// pcg32 (pcg_setseq_64_xsh_rr_32).
const pcgMultiplier uint64 = 6364136223846793005

// PCG32 is the PCG32 generator: a 64-bit linear congruential state with the
// XSH-RR output permutation, producing 32-bit values. It matches the PCG
// paper's reference pcg32 (pcg_setseq_64_xsh_rr_32) bit for bit: the
// increment is (seq<<1)|1, so every seq selects a distinct stream.
//
// A PCG32 is a small value type (24 bytes) and is not safe for concurrent use.
// Copying a PCG32 copies its position in the stream.
type PCG32 struct {
	state uint64
	inc   uint64
	draws uint64
}

// NewPCG32 returns a generator seeded exactly like the reference
// pcg32_srandom_r(rng, seed, seq): state = 0, inc = (seq<<1)|1, one step,
// state += seed, one more step. The two seeding steps are not counted by
// Draws.
func NewPCG32(seed, seq uint64) *PCG32 {
	r := &PCG32{}
	r.Seed(seed, seq)
	return r
}

// Seed re-seeds r in place, exactly like NewPCG32, and resets Draws to 0.
func (r *PCG32) Seed(seed, seq uint64) {
	r.state = 0
	r.inc = seq<<1 | 1
	r.step()
	r.state += seed
	r.step()
	r.draws = 0
}

func (r *PCG32) step() { r.state = r.state*pcgMultiplier + r.inc }

// Uint32 returns the next 32-bit output (one draw): the XSH-RR permutation of
// the old state, after which the state advances one LCG step.
func (r *PCG32) Uint32() uint32 {
	old := r.state
	r.state = old*pcgMultiplier + r.inc
	r.draws++
	xorshifted := uint32(((old >> 18) ^ old) >> 27)
	rot := int(old >> 59)
	return bits.RotateLeft32(xorshifted, -rot)
}

// Float64 returns a uniform float64 in [0, 1) with 53 random bits. It
// consumes exactly two draws: the first Uint32 supplies the high 32 bits and
// the second the low 32 bits of a 64-bit value whose top 53 bits are scaled
// by 2^-53.
func (r *PCG32) Float64() float64 {
	hi := uint64(r.Uint32())
	lo := uint64(r.Uint32())
	return float64((hi<<32|lo)>>11) * 0x1p-53
}

// Draws returns how many Uint32 draws r has produced since it was seeded,
// including those skipped by Advance (Float64 counts as two).
func (r *PCG32) Draws() uint64 { return r.draws }

// Advance moves r ahead by n draws in O(log n) steps, so that r is in the
// same state as after n calls to Uint32 (Draws grows by n). It uses the
// LCG jump-ahead: n steps of x -> a*x + c compose to x -> A*x + C, computed
// by repeated squaring. Arithmetic is modulo 2^64, so Advance(2^64 - k) is a
// way of stepping back k draws in the stream (Draws wraps accordingly).
func (r *PCG32) Advance(n uint64) {
	accMult, accPlus := uint64(1), uint64(0)
	curMult, curPlus := pcgMultiplier, r.inc
	for delta := n; delta > 0; delta >>= 1 {
		if delta&1 != 0 {
			accMult *= curMult
			accPlus = accPlus*curMult + curPlus
		}
		curPlus = (curMult + 1) * curPlus
		curMult *= curMult
	}
	r.state = accMult*r.state + accPlus
	r.draws += n
}
