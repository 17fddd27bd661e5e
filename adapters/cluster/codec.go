package cluster

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"time"

	"github.com/tlgw/tlgw/internal/config"
)

// routesDoc, staticDoc and poolsDoc are the stored tables: the admin API's body shapes.
type routesDoc struct {
	Routes []config.Route `json:"routes"`
}

type staticDoc struct {
	StaticWorkers []config.StaticWorker `json:"static_workers"`
}

type poolsDoc struct {
	EnginePools []config.EnginePool `json:"engine_pools"`
}

func marshal(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("cluster: encode: %w", err)
	}
	return string(b), nil
}

// decodeStrict reads exactly one JSON object with no unknown fields, of at most limit bytes.
func decodeStrict(b []byte, limit int, dst any) error {
	if len(b) > limit {
		return fmt.Errorf("%d bytes, over the bound of %d", len(b), limit)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("trailing data after the JSON object")
	}
	return nil
}

// decodeRoutes reads a stored route table and validates it as a PUT's body would be.
func decodeRoutes(b []byte) ([]config.Route, error) {
	var d struct {
		Routes *[]config.Route `json:"routes"`
	}
	if err := decodeStrict(b, MaxTableBytes, &d); err != nil {
		return nil, err
	}
	if d.Routes == nil {
		return nil, fmt.Errorf(`"routes" is missing`)
	}
	routes := config.NormalizeRoutes(*d.Routes)
	if err := config.ValidateRoutes(routes); err != nil {
		return nil, err
	}
	return routes, nil
}

// decodeStatic reads a stored static worker table and validates it.
func decodeStatic(b []byte) ([]config.StaticWorker, error) {
	var d struct {
		StaticWorkers *[]config.StaticWorker `json:"static_workers"`
	}
	if err := decodeStrict(b, MaxTableBytes, &d); err != nil {
		return nil, err
	}
	if d.StaticWorkers == nil {
		return nil, fmt.Errorf(`"static_workers" is missing`)
	}
	if err := config.ValidateStaticWorkers(*d.StaticWorkers); err != nil {
		return nil, err
	}
	return config.NormalizeStaticWorkers(*d.StaticWorkers), nil
}

// decodePools reads a stored engine pool table and validates it as a PUT's body would be.
func decodePools(b []byte) ([]config.EnginePool, error) {
	var d struct {
		EnginePools *[]config.EnginePool `json:"engine_pools"`
	}
	if err := decodeStrict(b, MaxTableBytes, &d); err != nil {
		return nil, err
	}
	if d.EnginePools == nil {
		return nil, fmt.Errorf(`"engine_pools" is missing`)
	}
	if err := config.ValidateEnginePools(*d.EnginePools); err != nil {
		return nil, err
	}
	return config.NormalizeEnginePools(*d.EnginePools), nil
}

// decodeReplica reads a replicas/<id> value; the id in it must be the key's.
func decodeReplica(id string, b []byte) (Replica, error) {
	if !config.ValidReplicaID(id) {
		return Replica{}, fmt.Errorf("replica key %q is not a replica id", id)
	}
	var r struct {
		ID          string    `json:"id"`
		HTTPAddress string    `json:"http_address"`
		GRPCAddress string    `json:"grpc_address"`
		StartedAt   time.Time `json:"started_at"`
		Self        bool      `json:"self"` // written as false; ignored
	}
	if err := decodeStrict(b, MaxReplicaBytes, &r); err != nil {
		return Replica{}, fmt.Errorf("replica %q: %w", id, err)
	}
	if r.ID != id {
		return Replica{}, fmt.Errorf("replica key %q holds id %q", id, r.ID)
	}
	for _, a := range []string{r.HTTPAddress, r.GRPCAddress} {
		if len(a) > 256 || !printable(a) {
			return Replica{}, fmt.Errorf("replica %q: an address is not up to 256 printable ASCII characters", id)
		}
	}
	return Replica{ID: r.ID, HTTPAddress: r.HTTPAddress, GRPCAddress: r.GRPCAddress, StartedAt: r.StartedAt.UTC()}, nil
}

// unescapeModel reverses the drained key's path escaping; the result is bounded.
func unescapeModel(s string) (string, error) {
	m, err := url.PathUnescape(s)
	if err != nil {
		return "", err
	}
	if m == "" || len(m) > MaxModelIDLen || url.PathEscape(m) != s {
		return "", fmt.Errorf("not a canonical escaped model id")
	}
	return m, nil
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

// decodeCanaryKey reads a stored canary key: exactly 64 hex digits (R20).
func decodeCanaryKey(val []byte) ([32]byte, error) { return decodeHexKey("a canary key", val) }

// decodePeerSecret reads the stored peer secret: exactly 64 hex digits (R23).
func decodePeerSecret(val []byte) ([32]byte, error) { return decodeHexKey("the peer secret", val) }

// decodeHexKey reads 32 bytes stored as exactly 64 hex digits; what names the key in errors.
func decodeHexKey(what string, val []byte) ([32]byte, error) {
	var k [32]byte
	if len(val) != hex.EncodedLen(len(k)) {
		return k, fmt.Errorf("cluster: %s is 64 hex digits, not %d bytes", what, len(val))
	}
	if _, err := hex.Decode(k[:], val); err != nil {
		return [32]byte{}, fmt.Errorf("cluster: %s is 64 hex digits: %w", what, err)
	}
	return k, nil
}
