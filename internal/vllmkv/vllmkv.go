// Package vllmkv is the wire codec of vLLM's KV-cache events (SPEC R22, ENGINES.md §1): a ZMQ
// message of three frames — topic, seq (8 bytes, big-endian), payload (msgpack) — whose payload
// is a batch [ts, events, data_parallel_rank?]. An event is an array (its type's name first,
// then its fields in order, trailing defaults omitted) or, in newer engines, a map with a
// "type" key and named fields: BlockStored, BlockRemoved, AllBlocksCleared. A block hash is an
// unsigned integer or bytes (a digest: its last 8 bytes, big-endian).
//
// Every byte is an engine's and hostile until checked: Decode bounds the payload, the events of
// a batch, the hashes and token ids of an event and every string, checks each length against
// the bytes left before it allocates, skips unknown fields and map keys (bounded in count and
// depth), and returns an error naming what was wrong; a batch is applied whole or not at all.
// Encode writes either shape, for tlengine and the tests.
package vllmkv

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Limits bound one decoded batch. The zero value of a field means its default.
type Limits struct {
	PayloadBytes int // a payload's bytes (default 4 MiB)
	Events       int // events of one batch (default 4,096)
	Hashes       int // block hashes of one event (default 4,096)
	Tokens       int // token ids of one event (default 262,144)
}

// Default limits.
const (
	DefaultPayloadBytes = 4 << 20
	DefaultEvents       = 4096
	DefaultHashes       = 4096
	DefaultTokens       = 1 << 18
	// MaxBlockSize bounds an event's block_size.
	MaxBlockSize = 1 << 16
	// maxHashBytes bounds a digest block hash.
	maxHashBytes = 64
	// MaxString bounds a string field (medium, lora_name, an event type) and an unknown map key.
	MaxString = 256
	// maxSkip bounds the values an unknown field may hold (nested, in all) before the batch is
	// refused.
	maxSkip = 1024
)

func (l Limits) withDefaults() Limits {
	if l.PayloadBytes <= 0 {
		l.PayloadBytes = DefaultPayloadBytes
	}
	if l.Events <= 0 {
		l.Events = DefaultEvents
	}
	if l.Hashes <= 0 {
		l.Hashes = DefaultHashes
	}
	if l.Tokens <= 0 {
		l.Tokens = DefaultTokens
	}
	return l
}

// Kind is an event's type.
type Kind uint8

// The event types.
const (
	BlockStored Kind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

var kindNames = [...]string{BlockStored: "BlockStored", BlockRemoved: "BlockRemoved", AllBlocksCleared: "AllBlocksCleared"}

func (k Kind) String() string {
	if k >= BlockStored && k <= AllBlocksCleared {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Event is one decoded event. Hashes are the blocks' engine hashes; for BlockStored, Parent is
// the hash of the block before the first (HasParent false when the sequence starts here),
// Tokens the blocks' token ids in order (BlockSize per block), LoRAID the adapter's id
// (HasLoRA false for the base model).
type Event struct {
	Kind      Kind
	Hashes    []uint64
	Parent    uint64
	HasParent bool
	Tokens    []uint32
	BlockSize int
	LoRAID    int64
	HasLoRA   bool
	Medium    string
	LoRAName  string
}

// Batch is one message: its topic and seq, and the payload's timestamp, events and data
// parallel rank (Rank -1 when absent).
type Batch struct {
	Topic  string
	Seq    uint64
	TS     float64
	Events []Event
	Rank   int
}

// ErrFrames: a message is not three frames with an 8-byte seq.
var ErrFrames = errors.New("vllmkv: a message is three frames: topic, an 8-byte seq, a payload")

// ReplaySentinelSeq is the seq of the message that ends a replay.
const ReplaySentinelSeq = math.MaxUint64

// DecodeMessage decodes the frames of one ZMQ message. The topic is at most MaxString bytes.
func DecodeMessage(frames [][]byte, l Limits) (Batch, error) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		return Batch{}, ErrFrames
	}
	if len(frames[0]) > MaxString {
		return Batch{}, fmt.Errorf("vllmkv: a topic of %d bytes, more than %d", len(frames[0]), MaxString)
	}
	b, err := DecodePayload(frames[2], l)
	if err != nil {
		return Batch{}, err
	}
	b.Topic, b.Seq = string(frames[0]), binary.BigEndian.Uint64(frames[1])
	return b, nil
}

// decoder reads one payload; left is the payload's bytes not yet read, which bounds every
// length before anything is allocated for it.
type decoder struct {
	d    *msgpack.Decoder
	r    *bytes.Reader
	l    Limits
	skip int
}

// DecodePayload decodes a batch's msgpack payload.
func DecodePayload(payload []byte, l Limits) (Batch, error) {
	l = l.withDefaults()
	if len(payload) > l.PayloadBytes {
		return Batch{}, fmt.Errorf("vllmkv: a payload of %d bytes, more than %d", len(payload), l.PayloadBytes)
	}
	r := bytes.NewReader(payload)
	dec := &decoder{d: msgpack.NewDecoder(r), r: r, l: l}
	b, err := dec.batch()
	if err != nil {
		return Batch{}, fmt.Errorf("vllmkv: %w", err)
	}
	if r.Len() != 0 {
		return Batch{}, fmt.Errorf("vllmkv: %d bytes after the batch", r.Len())
	}
	return b, nil
}

// arrayLen reads an array header whose length is at most max and could fit in the bytes left
// (each element is at least one byte).
func (d *decoder) arrayLen(what string, max int) (int, error) {
	n, err := d.d.DecodeArrayLen()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	if n > max || n > d.r.Len() { // n is -1 for nil
		return 0, fmt.Errorf("%s: %d elements, more than %d or than the bytes left", what, n, max)
	}
	return n, nil
}

func (d *decoder) batch() (Batch, error) {
	n, err := d.arrayLen("batch", 3)
	if err != nil {
		return Batch{}, err
	}
	if n < 2 {
		return Batch{}, errors.New("batch: want [ts, events, rank?]")
	}
	var b Batch
	if b.TS, err = d.d.DecodeFloat64(); err != nil || math.IsNaN(b.TS) || math.IsInf(b.TS, 0) {
		return Batch{}, fmt.Errorf("batch ts: want a finite number (%v)", err)
	}
	ne, err := d.arrayLen("events", d.l.Events)
	if err != nil {
		return Batch{}, err
	}
	if ne > 0 {
		b.Events = make([]Event, 0, ne)
	}
	for i := 0; i < ne; i++ {
		e, err := d.event()
		if err != nil {
			return Batch{}, fmt.Errorf("event %d: %w", i, err)
		}
		b.Events = append(b.Events, e)
	}
	b.Rank = -1
	if n == 3 {
		if isNil, err := d.isNil(); err != nil {
			return Batch{}, err
		} else if !isNil {
			r, err := d.d.DecodeInt64()
			if err != nil || r < 0 || r > math.MaxInt32 {
				return Batch{}, fmt.Errorf("batch data_parallel_rank: want a small non-negative int (%v)", err)
			}
			b.Rank = int(r)
		}
	}
	return b, nil
}

// isNil reads a nil if one is next.
func (d *decoder) isNil() (bool, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return false, err
	}
	if c == msgpcode.Nil {
		return true, d.d.DecodeNil()
	}
	return false, nil
}

func (d *decoder) event() (Event, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return Event{}, err
	}
	if msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32 {
		return d.mapEvent()
	}
	n, err := d.arrayLen("event", 64)
	if err != nil {
		return Event{}, err
	}
	if n < 1 {
		return Event{}, errors.New("an event array names its type first")
	}
	name, err := d.str("event type")
	if err != nil {
		return Event{}, err
	}
	e := Event{Kind: kindOf(name)}
	fields := eventFields[e.Kind]
	if fields == nil {
		return Event{}, fmt.Errorf("unknown event type %q", name)
	}
	for i := 1; i < n; i++ {
		if i-1 < len(fields) {
			if err := d.field(&e, fields[i-1]); err != nil {
				return Event{}, err
			}
			continue
		}
		if err := d.skipValue(); err != nil { // trailing fields of a newer engine
			return Event{}, err
		}
	}
	return e, e.check()
}

func (d *decoder) mapEvent() (Event, error) {
	n, err := d.d.DecodeMapLen()
	if err != nil {
		return Event{}, err
	}
	if n > 64 || n > d.r.Len() {
		return Event{}, fmt.Errorf("an event map of %d keys", n)
	}
	var e Event
	seen := 0
	for i := 0; i < n; i++ {
		k, err := d.str("event key")
		if err != nil {
			return Event{}, err
		}
		if k == "type" {
			name, err := d.str("event type")
			if err != nil {
				return Event{}, err
			}
			if e.Kind = kindOf(name); e.Kind == 0 {
				return Event{}, fmt.Errorf("unknown event type %q", name)
			}
			continue
		}
		f := fieldByName(k)
		if f == 0 {
			if err := d.skipValue(); err != nil {
				return Event{}, err
			}
			continue
		}
		if seen&(1<<f) != 0 {
			return Event{}, fmt.Errorf("field %s twice", fieldNames[f])
		}
		seen |= 1 << f
		if err := d.field(&e, f); err != nil {
			return Event{}, err
		}
	}
	if e.Kind == 0 {
		return Event{}, errors.New(`an event map without "type"`)
	}
	return e, e.check()
}

// check holds an event to its type's rules.
func (e *Event) check() error {
	switch e.Kind {
	case BlockStored:
		if e.BlockSize <= 0 || e.BlockSize > MaxBlockSize {
			return fmt.Errorf("BlockStored: block_size %d", e.BlockSize)
		}
		if len(e.Tokens) != len(e.Hashes)*e.BlockSize {
			return fmt.Errorf("BlockStored: %d token ids for %d blocks of %d", len(e.Tokens), len(e.Hashes), e.BlockSize)
		}
	case AllBlocksCleared:
		if len(e.Hashes) != 0 || len(e.Tokens) != 0 {
			return errors.New("AllBlocksCleared carries blocks")
		}
	}
	return nil
}

// Fields by number (0 is none).
const (
	fHashes = iota + 1
	fParent
	fTokens
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
)

var fieldNames = [...]string{fHashes: "block_hashes", fParent: "parent_block_hash", fTokens: "token_ids",
	fBlockSize: "block_size", fLoRAID: "lora_id", fMedium: "medium", fLoRAName: "lora_name"}

// eventFields are each type's fields in the array shape's order.
var eventFields = [...][]int{
	BlockStored:      {fHashes, fParent, fTokens, fBlockSize, fLoRAID, fMedium, fLoRAName},
	BlockRemoved:     {fHashes, fMedium},
	AllBlocksCleared: {},
}

func kindOf(name string) Kind {
	for k := BlockStored; k <= AllBlocksCleared; k++ {
		if kindNames[k] == name {
			return k
		}
	}
	return 0
}

func fieldByName(name string) int {
	for f := fHashes; f <= fLoRAName; f++ {
		if fieldNames[f] == name {
			return f
		}
	}
	return 0
}

func (d *decoder) field(e *Event, f int) error {
	var err error
	switch f {
	case fHashes:
		e.Hashes, err = d.hashes()
	case fParent:
		var isNil bool
		if isNil, err = d.isNil(); err == nil && !isNil {
			e.Parent, err = d.hash()
			e.HasParent = err == nil
		}
	case fTokens:
		e.Tokens, err = d.tokens()
	case fBlockSize:
		var n int64
		if n, err = d.d.DecodeInt64(); err == nil {
			if n <= 0 || n > MaxBlockSize {
				err = fmt.Errorf("block_size %d", n)
			}
			e.BlockSize = int(n)
		}
	case fLoRAID:
		var isNil bool
		if isNil, err = d.isNil(); err == nil && !isNil {
			e.LoRAID, err = d.d.DecodeInt64()
			e.HasLoRA = err == nil
		}
	case fMedium:
		e.Medium, err = d.optStr("medium")
	case fLoRAName:
		e.LoRAName, err = d.optStr("lora_name")
	}
	if err != nil {
		return fmt.Errorf("%s: %w", fieldNames[f], err)
	}
	return nil
}

func (d *decoder) hashes() ([]uint64, error) {
	n, err := d.arrayLen("block_hashes", d.l.Hashes)
	if err != nil || n <= 0 {
		return nil, err
	}
	out := make([]uint64, n)
	for i := range out {
		if out[i], err = d.hash(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// hash reads a block hash: an unsigned (or non-negative) integer, or bytes whose last 8 bytes
// are taken big-endian (fewer are zero-extended).
func (d *decoder) hash() (uint64, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return 0, err
	}
	if msgpcode.IsBin(c) || msgpcode.IsString(c) {
		n, err := d.d.DecodeBytesLen()
		if err != nil {
			return 0, err
		}
		if n < 0 || n > maxHashBytes || n > d.r.Len() {
			return 0, fmt.Errorf("a block hash of %d bytes", n)
		}
		var buf [maxHashBytes]byte
		if _, err := io.ReadFull(d.r, buf[:n]); err != nil {
			return 0, err
		}
		var last [8]byte
		copy(last[8-min(n, 8):], buf[max(n-8, 0):n])
		return binary.BigEndian.Uint64(last[:]), nil
	}
	return d.d.DecodeUint64() // a signed hash: its two's complement bits
}

func (d *decoder) tokens() ([]uint32, error) {
	n, err := d.arrayLen("token_ids", d.l.Tokens)
	if err != nil || n <= 0 {
		return nil, err
	}
	out := make([]uint32, n)
	for i := range out {
		v, err := d.d.DecodeInt64()
		if err != nil {
			return nil, err
		}
		if v < 0 || v > math.MaxUint32 {
			return nil, fmt.Errorf("token id %d", v)
		}
		out[i] = uint32(v)
	}
	return out, nil
}

// str reads a string of at most MaxString bytes.
func (d *decoder) str(what string) (string, error) {
	n, err := d.d.DecodeBytesLen()
	if err != nil {
		return "", fmt.Errorf("%s: %w", what, err)
	}
	if n < 0 || n > MaxString || n > d.r.Len() {
		return "", fmt.Errorf("%s: a string of %d bytes", what, n)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(d.r, b); err != nil {
		return "", err
	}
	return string(b), nil
}

// optStr reads a string or nil ("").
func (d *decoder) optStr(what string) (string, error) {
	if isNil, err := d.isNil(); err != nil || isNil {
		return "", err
	}
	return d.str(what)
}

// skipValue skips one value of an unknown field, counting what it holds against maxSkip.
func (d *decoder) skipValue() error {
	d.skip++
	if d.skip > maxSkip {
		return errors.New("too many unknown values")
	}
	c, err := d.d.PeekCode()
	if err != nil {
		return err
	}
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.arrayLen("an unknown array", maxSkip)
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if err := d.skipValue(); err != nil {
				return err
			}
		}
		return nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.d.DecodeMapLen()
		if err != nil {
			return err
		}
		if n > maxSkip || 2*n > d.r.Len() {
			return fmt.Errorf("an unknown map of %d keys", n)
		}
		for i := 0; i < 2*n; i++ {
			if err := d.skipValue(); err != nil {
				return err
			}
		}
		return nil
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		n, err := d.d.DecodeBytesLen()
		if err != nil {
			return err
		}
		if n < 0 || n > d.r.Len() {
			return fmt.Errorf("an unknown string of %d bytes", n)
		}
		_, err = d.r.Seek(int64(n), io.SeekCurrent)
		return err
	case msgpcode.IsExt(c):
		return errors.New("an extension value")
	}
	return d.d.Skip() // a number, bool or nil
}
