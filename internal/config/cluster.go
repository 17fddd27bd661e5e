package config

import (
	"net"
	"strconv"
	"strings"
	"time"
)

// Cluster is the [cluster] table (R16): the etcd cluster several gateway replicas share their
// routes, static workers and drained models through. Without the table Enabled is false and
// the gateway keeps that state in memory, as one process.
type Cluster struct {
	// Enabled is true when the [cluster] table is present.
	Enabled bool
	// EtcdEndpoints are the etcd members' host:port (at least one).
	EtcdEndpoints []string
	// Prefix is the key prefix every key of this gateway fleet lives under; it ends in "/".
	Prefix string
	// ReplicaID names this replica in replicas/ ("" = hostname:http port, resolved at start).
	ReplicaID string
	// LeaseTTL is how long a replica that stops renewing stays listed (2s to 1h).
	LeaseTTL time.Duration
	// TLSCA verifies etcd's certificate; TLSCert and TLSKey are a client certificate for etcd's
	// --client-cert-auth. Any of them set means TLS.
	TLSCA, TLSCert, TLSKey string
	// Username and Password authenticate to etcd (auth enabled); Password comes from
	// PasswordEnv and is never marshalled.
	Username    string
	Password    string `json:"-"`
	PasswordEnv string
	// LoadShareInterval is how often this replica tells the others its in-flight requests per
	// worker over their registry ports (R23, adapters/replicaload); 0 turns sharing off.
	LoadShareInterval time.Duration
	// AdvertiseAddress is the registry host:port the other replicas dial for load sharing ("" =
	// registry_listen when it names a host, else this host's first non-loopback address at its
	// port, resolved at start).
	AdvertiseAddress string
}

// Load sharing bounds: a table every MinLoadShare at most often, every MaxLoadShare at least
// (past that the counts are too old to route by).
const (
	DefaultLoadShare = 100 * time.Millisecond
	MinLoadShare     = 10 * time.Millisecond
	MaxLoadShare     = 10 * time.Second
)

// TLS reports whether the etcd connection uses TLS.
func (c *Cluster) TLS() bool { return c.TLSCA != "" || c.TLSCert != "" }

// MaxReplicaIDLen bounds a replica id: it is part of an etcd key and of the replicas view.
const MaxReplicaIDLen = 128

func defaultCluster() Cluster {
	return Cluster{Prefix: "/tlgw/", LeaseTTL: 10 * time.Second, LoadShareInterval: DefaultLoadShare}
}

type fileCluster struct {
	EtcdEndpoints []string `json:"etcd_endpoints"`
	Prefix        *string  `json:"prefix"`
	ReplicaID     *string  `json:"replica_id"`
	LeaseTTL      *string  `json:"lease_ttl"`
	TLSCA         *string  `json:"tls_ca"`
	TLSCert       *string  `json:"tls_cert"`
	TLSKey        *string  `json:"tls_key"`
	Username      *string  `json:"username"`
	PasswordEnv   *string  `json:"password_env"`
	LoadShare     *string  `json:"load_share_interval"`
	Advertise     *string  `json:"advertise_address"`
}

func (fc *fileCluster) apply(c *Cluster, getenv func(string) string, ps *problems) {
	if fc == nil {
		return
	}
	base := path{key("cluster")}
	c.Enabled = true
	if len(fc.EtcdEndpoints) == 0 {
		ps.add(base.with(key("etcd_endpoints")), "needs at least one etcd endpoint host:port")
	}
	for i, e := range fc.EtcdEndpoints {
		if !validHostPort(e) {
			ps.add(base.with(key("etcd_endpoints"), index(i)), "%q is not host:port", e)
		}
	}
	c.EtcdEndpoints = append([]string(nil), fc.EtcdEndpoints...)
	setIf(&c.Prefix, fc.Prefix)
	if !ValidClusterPrefix(c.Prefix) {
		ps.add(base.with(key("prefix")), "%q must start and end with \"/\" and hold only printable ASCII without spaces (at most 256 bytes)", c.Prefix)
	}
	setIf(&c.ReplicaID, fc.ReplicaID)
	if fc.ReplicaID != nil && !ValidReplicaID(c.ReplicaID) {
		ps.add(base.with(key("replica_id")), "must be 1 to %d printable ASCII characters without spaces or \"/\"", MaxReplicaIDLen)
	}
	duration(&c.LeaseTTL, fc.LeaseTTL, base.with(key("lease_ttl")), ps)
	if fc.LeaseTTL != nil && c.LeaseTTL > 0 && (c.LeaseTTL < 2*time.Second || c.LeaseTTL > time.Hour || c.LeaseTTL%time.Second != 0) {
		// etcd leases are granted in whole seconds, and it refuses TTLs under its minimum.
		ps.add(base.with(key("lease_ttl")), "must be whole seconds from 2s to 1h")
	}
	setIf(&c.TLSCA, fc.TLSCA)
	setIf(&c.TLSCert, fc.TLSCert)
	setIf(&c.TLSKey, fc.TLSKey)
	if (c.TLSCert == "") != (c.TLSKey == "") {
		ps.add(base.with(key("tls_key")), "tls_cert and tls_key go together; give both or neither")
	}
	if fc.LoadShare != nil {
		d, err := time.ParseDuration(*fc.LoadShare)
		if err != nil || (d != 0 && (d < MinLoadShare || d > MaxLoadShare)) {
			ps.add(base.with(key("load_share_interval")), "%q must be a duration, 0 (off) or %v to %v", *fc.LoadShare, MinLoadShare, MaxLoadShare)
		} else {
			c.LoadShareInterval = d
		}
	}
	setIf(&c.AdvertiseAddress, fc.Advertise)
	if fc.Advertise != nil && !validHostPort(c.AdvertiseAddress) {
		ps.add(base.with(key("advertise_address")), "%q is not host:port", c.AdvertiseAddress)
	}
	setIf(&c.Username, fc.Username)
	switch {
	case fc.Username != nil && fc.PasswordEnv == nil:
		ps.add(base.with(key("password_env")), "username needs password_env, the environment variable holding its password")
	case fc.PasswordEnv != nil && fc.Username == nil:
		ps.add(base.with(key("username")), "password_env needs the username it belongs to")
	case fc.PasswordEnv != nil:
		c.PasswordEnv = *fc.PasswordEnv
		if c.Password = getenv(c.PasswordEnv); c.Password == "" {
			ps.add(base.with(key("password_env")), "environment variable %s is not set or is empty", c.PasswordEnv)
		}
	}
}

// validHostPort reports whether s is host:port with a non-empty host and a port 1–65535.
func validHostPort(s string) bool {
	h, p, err := net.SplitHostPort(s)
	if err != nil || h == "" || strings.ContainsAny(h, " /") {
		return false
	}
	n, err := strconv.Atoi(p)
	return err == nil && n > 0 && n < 65536
}

// ValidClusterPrefix reports whether p can be the etcd key prefix.
func ValidClusterPrefix(p string) bool {
	return len(p) >= 1 && len(p) <= 256 && strings.HasPrefix(p, "/") && strings.HasSuffix(p, "/") && printableNoSpace(p)
}

// ValidReplicaID reports whether id can name a replica: 1 to MaxReplicaIDLen printable ASCII
// characters, no space and no "/" (it is the last element of an etcd key).
func ValidReplicaID(id string) bool {
	return id != "" && len(id) <= MaxReplicaIDLen && !strings.Contains(id, "/") && printableNoSpace(id)
}

func printableNoSpace(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= 0x20 || s[i] >= 0x7f {
			return false
		}
	}
	return true
}
