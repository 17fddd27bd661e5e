package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// PeerSecret is the secret every replica of the fleet presents to the others' ReplicaLoad
// service (adapters/replicaload, R23), 32 bytes. The first replica to ask creates it: it puts
// 32 random bytes at peer_secret only if the key is absent, in one transaction whose other
// branch reads the key, so replicas asking at once all end with the one that was stored.
//
// The store does not follow the key: a replica reads it when it starts its exchange. A
// deleted key is created anew by the next replica that asks, which the replicas already
// running do not share until they ask again (restart).
//
// ErrUnavailable while etcd has never been reached or does not answer; an error naming the
// key when what is stored there is not 64 hex digits (nothing is overwritten).
func (s *Store) PeerSecret(ctx context.Context) ([]byte, error) {
	cli := s.c()
	if cli == nil {
		return nil, ErrUnavailable
	}
	// The secret comes from crypto/rand, not an injected source: no test needs to know it,
	// and only an unpredictable one keeps a stranger off the exchange.
	var fresh [32]byte
	if _, err := rand.Read(fresh[:]); err != nil {
		return nil, fmt.Errorf("cluster: peer secret: %w", err)
	}
	k := s.key(KeyPeerSecret)
	octx, cancel := s.op(ctx)
	defer cancel()
	resp, err := cli.Txn(octx).
		If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, hex.EncodeToString(fresh[:]))).
		Else(clientv3.OpGet(k)).
		Commit()
	if err != nil {
		return nil, s.unavailable("peer secret", err)
	}
	if resp.Succeeded {
		s.log.Info("stored a new peer secret in etcd (none was there)", "key", k)
		return fresh[:], nil
	}
	if len(resp.Responses) != 1 || resp.Responses[0].GetResponseRange() == nil || len(resp.Responses[0].GetResponseRange().Kvs) != 1 {
		// The key existed at the compare and the read is of the same revision.
		return nil, fmt.Errorf("cluster: etcd answered no value for %s, which exists", k)
	}
	sec, err := decodePeerSecret(resp.Responses[0].GetResponseRange().Kvs[0].Value)
	if err != nil {
		return nil, fmt.Errorf("%w (key %s; delete it to have a new one made)", err, k)
	}
	return sec[:], nil
}
