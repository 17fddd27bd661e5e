package cluster

import (
	"encoding/hex"
	"strings"
	"testing"
	"time"
)

func TestDecodeRoutes(t *testing.T) {
	rs, err := decodeRoutes([]byte(`{"routes":[{"model":"chat","aliases":["c"],"backends":[{"model":"a","weight":1}]}]}`))
	if err != nil || len(rs) != 1 || rs[0].Model != "chat" || rs[0].Aliases[0] != "c" {
		t.Fatalf("%+v %v", rs, err)
	}
	for name, in := range map[string]string{
		"missing":        `{}`,
		"unknown field":  `{"routes":[],"epoch":1}`,
		"unknown nested": `{"routes":[{"model":"a","colour":"red"}]}`,
		"trailing":       `{"routes":[]} {}`,
		"invalid route":  `{"routes":[{"model":"a","backends":[{"model":"b","weight":-1}]}]}`,
		"not json":       `routes`,
		"too big":        `{"routes":[` + strings.Repeat(" ", MaxTableBytes) + `]}`,
	} {
		if _, err := decodeRoutes([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestDecodeStatic(t *testing.T) {
	ws, err := decodeStatic([]byte(`{"static_workers":[{"id":"v","model":"m","http_address":"10.0.0.1:8000","metrics":"vllm"}]}`))
	if err != nil || len(ws) != 1 || ws[0].MetricsURL != "http://10.0.0.1:8000/metrics" {
		t.Fatalf("%+v %v", ws, err)
	}
	for name, in := range map[string]string{
		"missing": `{"routes":[]}`,
		"invalid": `{"static_workers":[{"id":"v","model":"m","http_address":"nohost","metrics":"vllm"}]}`,
		"big":     `{"static_workers":[` + strings.Repeat(" ", MaxTableBytes) + `]}`,
	} {
		if _, err := decodeStatic([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestDecodeReplica(t *testing.T) {
	r, err := decodeReplica("gw-1", []byte(`{"id":"gw-1","http_address":"10.0.0.1:8080","grpc_address":"10.0.0.1:9090","started_at":"2026-12-01T12:00:00+01:00","self":true}`))
	if err != nil || r.ID != "gw-1" || r.Self || !r.StartedAt.Equal(time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC)) || r.StartedAt.Location() != time.UTC {
		t.Fatalf("%+v %v", r, err)
	}
	for name, c := range map[string]struct{ id, val string }{
		"id mismatch":   {"gw-1", `{"id":"gw-2"}`},
		"bad key id":    {"a b", `{"id":"a b"}`},
		"empty key id":  {"", `{"id":""}`},
		"unknown field": {"gw-1", `{"id":"gw-1","role":"leader"}`},
		"control chars": {"gw-1", `{"id":"gw-1","http_address":"a\u0007b"}`},
		"long address":  {"gw-1", `{"id":"gw-1","http_address":"` + strings.Repeat("a", 257) + `"}`},
		"too big":       {"gw-1", `{"id":"gw-1","http_address":"` + strings.Repeat("a", MaxReplicaBytes) + `"}`},
	} {
		if _, err := decodeReplica(c.id, []byte(c.val)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestUnescapeModel(t *testing.T) {
	for in, want := range map[string]string{"llama": "llama", "org%2Fm:8b": "org/m:8b", "a%20b": "a b"} {
		if got, err := unescapeModel(in); err != nil || got != want {
			t.Errorf("%q: %q %v", in, got, err)
		}
	}
	for _, in := range []string{"", "%zz", "a%2fb" /* not canonical */, "a/b", strings.Repeat("m", MaxModelIDLen+1)} {
		if _, err := unescapeModel(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

// FuzzDecode: nothing etcd holds makes a decoder panic, and whatever they accept is within
// their bounds and round-trips.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"routes":[{"model":"a"}]}`), "gw")
	f.Add([]byte(`{"static_workers":[]}`), "x")
	f.Add([]byte(`{"id":"gw","http_address":"h:1"}`), "gw")
	f.Add([]byte(`a%2Fb`), "a%2Fb")
	f.Add([]byte(strings.Repeat("ab", 32)), "k")
	f.Fuzz(func(t *testing.T, b []byte, s string) {
		if rs, err := decodeRoutes(b); err == nil {
			if len(b) > MaxTableBytes {
				t.Fatal("over the bound")
			}
			out, err := marshal(routesDoc{Routes: nonNil(rs)})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := decodeRoutes([]byte(out)); err != nil {
				t.Fatalf("re-encoded table refused: %v", err)
			}
		}
		_, _ = decodeStatic(b)
		if r, err := decodeReplica(s, b); err == nil && r.ID != s {
			t.Fatalf("replica %q under key %q", r.ID, s)
		}
		if m, err := unescapeModel(s); err == nil && (len(m) > MaxModelIDLen || m == "") {
			t.Fatalf("model %q", m)
		}
		if k, err := decodeCanaryKey(b); err == nil {
			if hex.EncodeToString(k[:]) != strings.ToLower(string(b)) {
				t.Fatalf("canary key %x from %q", k, b)
			}
		} else if k != ([32]byte{}) {
			t.Fatalf("a refused canary key gave %x", k)
		}
	})
}

// TestDecodeCanaryKey: exactly 64 hex digits (either case) are a key; 63, 65, or a non-hex
// digit are refused with nothing decoded.
func TestDecodeCanaryKey(t *testing.T) {
	good := strings.Repeat("0f", 32)
	if k, err := decodeCanaryKey([]byte(strings.ToUpper(good))); err != nil || k[0] != 0x0f || k[31] != 0x0f {
		t.Fatalf("%x %v", k, err)
	}
	for _, bad := range []string{good[:63], good + "0", good[:62] + "0g", ""} {
		if k, err := decodeCanaryKey([]byte(bad)); err == nil || k != ([32]byte{}) {
			t.Fatalf("%q: %x %v, want refused", bad, k, err)
		}
	}
}

// TestDecodeBoundaries: every bound admits exactly its limit.
func TestDecodeBoundaries(t *testing.T) {
	at := `{"id":"gw","http_address":"` + strings.Repeat("a", 256) + `","grpc_address":" ~"}`
	if _, err := decodeReplica("gw", []byte(at)); err != nil {
		t.Fatalf("a 256-byte address and the printable ends: %v", err)
	}
	if _, err := decodeReplica("gw", []byte(`{"id":"gw","http_address":"a\u007fb"}`)); err == nil {
		t.Fatal("DEL accepted")
	}
	if _, err := decodeReplica("gw", []byte(`{"id":"gw","http_address":"a\u001fb"}`)); err == nil {
		t.Fatal("a control character accepted")
	}
	if err := decodeStrict([]byte(`{}`), 2, &struct{}{}); err != nil {
		t.Fatalf("a value of exactly the bound: %v", err)
	}
	if err := decodeStrict([]byte(`{} `), 2, &struct{}{}); err == nil {
		t.Fatal("a value one byte over the bound accepted")
	}
	long := strings.Repeat("m", MaxModelIDLen)
	if m, err := unescapeModel(long); err != nil || m != long {
		t.Fatalf("a model id of exactly %d bytes: %v", MaxModelIDLen, err)
	}
}
