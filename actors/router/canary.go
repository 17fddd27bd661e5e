package router

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"hash"
)

// CanaryKey is the secret of the canary draw (R20). The draw that splits a route's backends is
// a keyed hash of the request id: a client that sets X-Request-ID cannot pick its backend, as
// it could with a public hash, and one id still lands on one backend. Each process draws its
// own key at start; in a cluster the replicas share one through etcd (R16), so an id lands on
// one backend whichever replica serves it.
type CanaryKey [32]byte

// NewCanaryKey draws a random key.
func NewCanaryKey() CanaryKey {
	var k CanaryKey
	_, _ = rand.Read(k[:]) // crypto/rand.Read never fails (it aborts the process instead)
	return k
}

// CanaryDraw maps a request id to u in [0, 1) under key: the top 53 bits of HMAC-SHA256(key,
// id) over 2^53 (R5 with R20's key). One id always gives the same u under one key, u is
// uniform over ids, and without the key nobody can tell which ids give which u.
func CanaryDraw(key CanaryKey, requestID string) float64 {
	return newCanaryDraw(key).draw(requestID)
}

// canaryDraw computes CanaryDraw with one MAC reused (the router's goroutine only).
type canaryDraw struct {
	mac hash.Hash
	buf []byte // the id's bytes; grows to the longest id drawn (ids are bounded by the HTTP layer)
	sum [sha256.Size]byte
}

func newCanaryDraw(key CanaryKey) *canaryDraw {
	return &canaryDraw{mac: hmac.New(sha256.New, key[:])}
}

func (d *canaryDraw) draw(requestID string) float64 {
	d.mac.Reset()
	d.buf = append(d.buf[:0], requestID...)
	d.mac.Write(d.buf)
	s := d.mac.Sum(d.sum[:0])
	return float64(binary.BigEndian.Uint64(s)>>11) / (1 << 53)
}

// canaryKey is k, or a random key when k is nil.
func canaryKey(k *CanaryKey) CanaryKey {
	if k != nil {
		return *k
	}
	return NewCanaryKey()
}
