package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/ratelimit"
)

// The rate-limit exchange (R13.5, R16; internal/ratelimit share.go): every RateInterval each
// replica puts its keys' usage under ratelimits/<id>, attached to its lease (it goes with the
// replica), when it changed; every replica follows the others' through the store's watch and
// hands their sum to its limiter. A request never waits on etcd: it reads the last sum.
//
// Bounds: one key per live replica (at most MaxReplicas are followed); a value holds at most
// MaxRateKeys keys and MaxRateBytes bytes; keys are configured key indexes (< MaxRateKey),
// never a client's string; one put per replica per RateInterval at most, none while nothing
// changed. With n replicas that is ≤ n puts and n² watched events per RateInterval.

// RateLimits is the limiter the exchange publishes and feeds (ratelimit.Limiter).
type RateLimits interface {
	Usage() []ratelimit.KeyUsage
	SetPeers(*ratelimit.Peers)
}

const (
	DirRates = "ratelimits/"
	// MaxRateBytes bounds a ratelimits/ value. MaxReplicas+1 of them (8.2 MiB) fit in a
	// session's read with the rest (MaxAnswer).
	MaxRateBytes = 8 << 10
	// MaxRateKeys bounds the keys of one value; MaxRateKey a key index; maxRateCount each
	// published count (a minute's requests or tokens, far above any real one).
	MaxRateKeys  = 4096
	MaxRateKey   = 1 << 20
	maxRateCount = 1 << 50
	// rateVersion is a value's first byte; rateFlagPartial in the second says the replica
	// had more usage than a value holds (its readers fall back to the even share). Version 2
	// puts the key table's fingerprint (Config.RateKeys, 8 bytes little-endian) after the
	// flags: replicas whose [[auth.keys]] differ (a rolling change of the table) number their
	// keys differently, so a reader takes another fingerprint's value as partial.
	rateVersion     = 2
	rateFlagPartial = 1
	rateHeader      = 2 + 8
)

// encodeRates is a ratelimits/ value: version, flags, the key table's fingerprint, the key
// count, then for each key (in ascending order) its index and its six counts, all unsigned
// varints. Usage that does not fit in MaxRateBytes is published as partial, with no keys.
func encodeRates(fp uint64, us []ratelimit.KeyUsage) []byte {
	b := make([]byte, 0, 64)
	b = append(b, rateVersion, 0)
	b = binary.LittleEndian.AppendUint64(b, fp)
	kept := 0
	for _, u := range us {
		if u.Key < 0 || u.Key >= MaxRateKey {
			continue // not a configured key's index: nothing a reader would take
		}
		kept++
	}
	b = binary.AppendUvarint(b, uint64(kept))
	for _, u := range us {
		if u.Key < 0 || u.Key >= MaxRateKey {
			continue
		}
		b = binary.AppendUvarint(b, uint64(u.Key))
		for _, v := range [...]int64{u.Requests, u.RequestDemand, u.Tokens, u.TokenDemand, u.InFlight, u.InFlightDemand} {
			b = binary.AppendUvarint(b, uint64(min(max(v, 0), maxRateCount)))
		}
	}
	if len(b) > MaxRateBytes || kept > MaxRateKeys {
		return append(binary.LittleEndian.AppendUint64([]byte{rateVersion, rateFlagPartial}, fp), 0) // no keys
	}
	return b
}

// decodeRates reads a ratelimits/ value: its key table's fingerprint, and partial or the
// keys' usage.
func decodeRates(b []byte) (fp uint64, us []ratelimit.KeyUsage, partial bool, err error) {
	if len(b) > MaxRateBytes {
		return 0, nil, false, fmt.Errorf("%d bytes, over the bound of %d", len(b), MaxRateBytes)
	}
	if len(b) < rateHeader+1 || b[0] != rateVersion || b[1]&^rateFlagPartial != 0 {
		return 0, nil, false, fmt.Errorf("not a version %d value", rateVersion)
	}
	fp = binary.LittleEndian.Uint64(b[2:rateHeader])
	r := bytes.NewReader(b[rateHeader:])
	n, err := binary.ReadUvarint(r)
	if err != nil || n > MaxRateKeys {
		return 0, nil, false, fmt.Errorf("key count: want ≤ %d", MaxRateKeys)
	}
	us = make([]ratelimit.KeyUsage, 0, n) // n ≤ MaxRateKeys
	for i := range n {
		k, err := binary.ReadUvarint(r)
		if err != nil || k >= MaxRateKey || (i > 0 && int(k) <= us[i-1].Key) {
			return 0, nil, false, fmt.Errorf("key %d: want ascending indexes below %d", i, MaxRateKey)
		}
		var v [6]int64
		for j := range v {
			x, err := binary.ReadUvarint(r)
			if err != nil || x > maxRateCount {
				return 0, nil, false, fmt.Errorf("key %d: count %d: want ≤ %d", i, j, uint64(maxRateCount))
			}
			v[j] = int64(x)
		}
		us = append(us, ratelimit.KeyUsage{Key: int(k), Usage: ratelimit.Usage{Requests: v[0], RequestDemand: v[1],
			Tokens: v[2], TokenDemand: v[3], InFlight: v[4], InFlightDemand: v[5]}})
	}
	if r.Len() != 0 {
		return 0, nil, false, errors.New("bytes after the last key")
	}
	partial = b[1]&rateFlagPartial != 0
	if partial && len(us) > 0 {
		return 0, nil, false, errors.New("a partial value lists keys")
	}
	return fp, us, partial, nil
}

// rateEntry is one other replica's last published usage.
type rateEntry struct {
	keys      []ratelimit.KeyUsage
	partial   bool
	otherKeys bool // published with another key table's fingerprint (then partial)
}

// putRatesLocked takes a watched or read ratelimits/ value; this replica's own is skipped
// (its limiter counts its own traffic as it happens).
func (s *Store) putRatesLocked(name string, val []byte) {
	id := strings.TrimPrefix(name, DirRates)
	if id == s.cfg.Self.ID {
		return
	}
	if _, ok := s.rates[id]; !ok && len(s.rates) >= s.maxReplicas {
		s.log.Error("rate-limit entries over the store's bound: ignored", "bound", s.maxReplicas)
		return
	}
	fp, us, partial, err := decodeRates(val)
	switch {
	case err != nil:
		// A live replica's usage this one cannot read (another version during an upgrade):
		// taken as partial, so every share falls back to the even one rather than missing it.
		s.log.Error("an unreadable ratelimits/ entry: the even share until it is readable", "replica", id, "err", err)
		us, partial = nil, true
	case fp != s.cfg.RateKeys:
		// Its [[auth.keys]] differ from this replica's (a rolling change): its key indexes are
		// not this replica's.
		if old, ok := s.rates[id]; !ok || !old.otherKeys {
			s.log.Warn("another replica's [[auth.keys]] differ from this one's: rate limits take the even share until they agree", "replica", id)
		}
		s.rates[id] = rateEntry{partial: true, otherKeys: true}
		return
	}
	s.rates[id] = rateEntry{keys: us, partial: partial}
}

// pushRatesLocked hands the limiter the others' summed usage, or nil (the even share) while
// etcd is away or a replica published partial usage.
func (s *Store) pushRatesLocked(up bool) {
	if s.cfg.Rates == nil {
		return
	}
	if !up {
		s.cfg.Rates.SetPeers(nil)
		s.m.rateExchange.Set(0)
		return
	}
	all := make([][]ratelimit.KeyUsage, 0, len(s.rates))
	for _, e := range s.rates {
		if e.partial {
			s.cfg.Rates.SetPeers(nil)
			s.m.rateExchange.Set(0)
			return
		}
		all = append(all, e.keys)
	}
	s.cfg.Rates.SetPeers(ratelimit.NewPeers(all...))
	s.m.rateExchange.Set(1)
}

// publishRates puts this replica's usage under its lease when it changed since the last put
// of this session (last); it returns what is stored now.
func (s *Store) publishRates(ctx context.Context, lease clientv3.LeaseID, last []byte) ([]byte, error) {
	val := encodeRates(s.cfg.RateKeys, s.cfg.Rates.Usage())
	if last != nil && bytes.Equal(val, last) {
		return last, nil
	}
	if val[1]&rateFlagPartial != 0 && (last == nil || last[1]&rateFlagPartial == 0) {
		s.log.Error("this replica's rate-limit usage is over the exchange's bound; every replica falls back to the even share", "bound_bytes", MaxRateBytes, "bound_keys", MaxRateKeys)
	}
	octx, cancel := s.op(ctx)
	defer cancel()
	if _, err := s.c().Put(octx, s.key(DirRates+s.cfg.Self.ID), string(val), clientv3.WithLease(lease)); err != nil {
		return nil, fmt.Errorf("publish rate-limit usage: %w", err)
	}
	return val, nil
}

// publishRatesNow asks the session to publish this replica's usage now rather than at the next
// RateInterval (it is dropped while one ask is pending, or while no session is up).
func (s *Store) publishRatesNow() {
	select {
	case s.ratesNow <- struct{}{}:
	default:
	}
}

// RateKeysFingerprint is Config.RateKeys for a key table: a digest of each key's secret (as a
// SHA-256, never the secret) and limits, in order. Only equality is read; etcd's readers learn
// no key from it.
func RateKeysFingerprint(keys []config.Key) uint64 {
	h := sha256.New()
	h.Write([]byte("tlgw rate-limit keys v1\x00"))
	for _, k := range keys {
		sum := sha256.Sum256([]byte(k.Key))
		h.Write(sum[:])
		for _, v := range [...]int64{k.RPM, k.TPM, k.MaxInFlight} {
			h.Write(binary.LittleEndian.AppendUint64(nil, uint64(v)))
		}
	}
	return binary.LittleEndian.Uint64(h.Sum(nil))
}
