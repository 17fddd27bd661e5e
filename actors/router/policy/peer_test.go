package policy

import "testing"

// A PeerLoader's cap is the pool's whole load's less each member's even share of the peer
// load; with none it is the bounded-load cap of one router.
func TestPeerCap(t *testing.T) {
	for _, c := range []struct {
		total, peer int64
		n           int
		want        int64
	}{
		{total: 775, peer: 0, n: 1000, want: 1},    // ⌈1.25·776/1000⌉
		{total: 775, peer: 5425, n: 1000, want: 3}, // ⌈1.25·6201/1000⌉ − 5 = 8 − 5
		{total: 6200, peer: 0, n: 1000, want: 8},   // one router with the whole load
		{total: 0, peer: 0, n: 0, want: 0},         // an empty pool
		{total: 10, peer: 30, n: 4, want: 13 - 7},  // ⌈1.25·41/4⌉ − ⌊30/4⌋
	} {
		if got := peerCap(1.25, c.total, c.peer, c.n); got != c.want {
			t.Errorf("peerCap(%d, %d, %d) = %d, want %d", c.total, c.peer, c.n, got, c.want)
		}
	}
	// Each bounded-load policy takes it.
	for _, name := range []string{"affinity", "prefix_aware", "precise_prefix", "predicted_latency"} {
		p, err := New(name, Options{LoadFactor: 1.25})
		if err != nil {
			t.Fatal(err)
		}
		pl, ok := p.(PeerLoader)
		if !ok {
			t.Fatalf("%s is not a PeerLoader", name)
		}
		ms := []*Member{{ID: "a"}, {ID: "b"}, {ID: "c"}, {ID: "d"}}
		for _, m := range ms {
			p.Add(m, 2, 1)
		}
		capper := p.(interface{ Cap() int64 })
		if got := capper.Cap(); got != 3 { // ⌈1.25·9/4⌉
			t.Fatalf("%s: cap %d without peers, want 3", name, got)
		}
		pl.SetPeerLoad(30)
		if got := capper.Cap(); got != 6 { // ⌈1.25·39/4⌉ − ⌊30/4⌋ = 13 − 7
			t.Fatalf("%s: cap %d with a peer load of 30, want 6", name, got)
		}
		pl.SetPeerLoad(-5) // never below none
		if got := capper.Cap(); got != 3 {
			t.Fatalf("%s: cap %d with a negative peer load, want 3", name, got)
		}
	}
}
