package vllmkv

import (
	"bytes"
	"encoding/binary"

	"github.com/vmihailenco/msgpack/v5"
)

// Format is an event's shape on the wire.
type Format uint8

// The shapes: Array (type name first, fields in order; vLLM's msgspec array_like) or Map (a
// "type" key and named fields; newer engines).
const (
	Array Format = iota
	Map
)

// EncodePayload writes batch b's payload ([ts, events] and its rank when Rank ≥ 0) with its
// events in format f. Hashes are written as unsigned integers; a BlockStored without a parent
// writes nil, one without a LoRA id nil.
func EncodePayload(b Batch, f Format) ([]byte, error) {
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	n := 2
	if b.Rank >= 0 {
		n = 3
	}
	if err := e.EncodeArrayLen(n); err != nil {
		return nil, err
	}
	if err := e.EncodeFloat64(b.TS); err != nil {
		return nil, err
	}
	if err := e.EncodeArrayLen(len(b.Events)); err != nil {
		return nil, err
	}
	for i := range b.Events {
		if err := encodeEvent(e, &b.Events[i], f); err != nil {
			return nil, err
		}
	}
	if n == 3 {
		if err := e.EncodeInt(int64(b.Rank)); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

// EncodeMessage is b's three frames: topic, seq, payload.
func EncodeMessage(b Batch, f Format) ([][]byte, error) {
	p, err := EncodePayload(b, f)
	if err != nil {
		return nil, err
	}
	seq := make([]byte, 8)
	binary.BigEndian.PutUint64(seq, b.Seq)
	return [][]byte{[]byte(b.Topic), seq, p}, nil
}

func encodeEvent(e *msgpack.Encoder, ev *Event, f Format) error {
	fields := eventFields[ev.Kind]
	if f == Map {
		if err := e.EncodeMapLen(len(fields) + 1); err != nil {
			return err
		}
		if err := e.EncodeString("type"); err != nil {
			return err
		}
	} else if err := e.EncodeArrayLen(len(fields) + 1); err != nil {
		return err
	}
	if err := e.EncodeString(ev.Kind.String()); err != nil {
		return err
	}
	for _, fl := range fields {
		if f == Map {
			if err := e.EncodeString(fieldNames[fl]); err != nil {
				return err
			}
		}
		if err := encodeField(e, ev, fl); err != nil {
			return err
		}
	}
	return nil
}

func encodeField(e *msgpack.Encoder, ev *Event, fl int) error {
	switch fl {
	case fHashes:
		if err := e.EncodeArrayLen(len(ev.Hashes)); err != nil {
			return err
		}
		for _, h := range ev.Hashes {
			if err := e.EncodeUint(h); err != nil {
				return err
			}
		}
		return nil
	case fParent:
		if !ev.HasParent {
			return e.EncodeNil()
		}
		return e.EncodeUint(ev.Parent)
	case fTokens:
		if err := e.EncodeArrayLen(len(ev.Tokens)); err != nil {
			return err
		}
		for _, t := range ev.Tokens {
			if err := e.EncodeUint(uint64(t)); err != nil {
				return err
			}
		}
		return nil
	case fBlockSize:
		return e.EncodeInt(int64(ev.BlockSize))
	case fLoRAID:
		if !ev.HasLoRA {
			return e.EncodeNil()
		}
		return e.EncodeInt(ev.LoRAID)
	case fMedium:
		if ev.Medium == "" {
			return e.EncodeNil()
		}
		return e.EncodeString(ev.Medium)
	case fLoRAName:
		if ev.LoRAName == "" {
			return e.EncodeNil()
		}
		return e.EncodeString(ev.LoRAName)
	}
	return nil
}
