package config

import (
	"strings"
	"testing"
	"time"
)

func TestClusterAbsentIsOneProcess(t *testing.T) {
	cfg, err := Parse(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Cluster.Enabled || cfg.Cluster.Prefix != "/tlgw/" || cfg.Cluster.LeaseTTL != 10*time.Second ||
		cfg.Cluster.LoadShareInterval != 100*time.Millisecond || cfg.Cluster.AdvertiseAddress != "" {
		t.Fatalf("cluster %+v", cfg.Cluster)
	}
}

func TestClusterTable(t *testing.T) {
	env := map[string]string{"ETCD_PW": "s3cret"}
	cfg, err := Parse([]byte(`
[cluster]
etcd_endpoints = ["127.0.0.1:2379", "etcd-1.internal:2379"]
prefix = "/prod/tlgw/"
replica_id = "gw-0:8080"
lease_ttl = "5s"
tls_ca = "/etc/etcd/ca.pem"
tls_cert = "/etc/etcd/client.pem"
tls_key = "/etc/etcd/client-key.pem"
username = "tlgw"
password_env = "ETCD_PW"
load_share_interval = "250ms"
advertise_address = "10.0.0.7:50051"
`), func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Cluster
	if !c.Enabled || len(c.EtcdEndpoints) != 2 || c.EtcdEndpoints[1] != "etcd-1.internal:2379" || c.Prefix != "/prod/tlgw/" ||
		c.ReplicaID != "gw-0:8080" || c.LeaseTTL != 5*time.Second || !c.TLS() || c.TLSKey != "/etc/etcd/client-key.pem" ||
		c.Username != "tlgw" || c.Password != "s3cret" || c.PasswordEnv != "ETCD_PW" ||
		c.LoadShareInterval != 250*time.Millisecond || c.AdvertiseAddress != "10.0.0.7:50051" {
		t.Fatalf("cluster %+v", c)
	}
	for v, want := range map[string]time.Duration{"0s": 0, "10ms": 10 * time.Millisecond, "10s": 10 * time.Second} {
		cfg, err := Parse([]byte("[cluster]\netcd_endpoints=['e:1']\nload_share_interval='"+v+"'\n"), nil)
		if err != nil || cfg.Cluster.LoadShareInterval != want {
			t.Fatalf("load_share_interval %s: %v, %v", v, err, cfg)
		}
	}
}

func TestClusterTableProblems(t *testing.T) {
	for name, c := range map[string]struct{ toml, key string }{
		"no endpoints":      {"[cluster]\nprefix='/x/'\n", "cluster"},
		"empty endpoints":   {"[cluster]\netcd_endpoints=[]\n", "cluster.etcd_endpoints"},
		"endpoint no port":  {"[cluster]\netcd_endpoints=['etcd']\n", "cluster.etcd_endpoints[0]"},
		"endpoint bad port": {"[cluster]\netcd_endpoints=['etcd:99999']\n", "cluster.etcd_endpoints[0]"},
		"endpoint url":      {"[cluster]\netcd_endpoints=['http://etcd:2379/x']\n", "cluster.etcd_endpoints[0]"},
		"prefix no slash":   {"[cluster]\netcd_endpoints=['e:1']\nprefix='tlgw'\n", "cluster.prefix"},
		"prefix no end":     {"[cluster]\netcd_endpoints=['e:1']\nprefix='/tlgw'\n", "cluster.prefix"},
		"prefix space":      {"[cluster]\netcd_endpoints=['e:1']\nprefix='/a b/'\n", "cluster.prefix"},
		"replica slash":     {"[cluster]\netcd_endpoints=['e:1']\nreplica_id='a/b'\n", "cluster.replica_id"},
		"replica long":      {"[cluster]\netcd_endpoints=['e:1']\nreplica_id='" + strings.Repeat("r", 129) + "'\n", "cluster.replica_id"},
		"ttl short":         {"[cluster]\netcd_endpoints=['e:1']\nlease_ttl='1s'\n", "cluster.lease_ttl"},
		"ttl fraction":      {"[cluster]\netcd_endpoints=['e:1']\nlease_ttl='2500ms'\n", "cluster.lease_ttl"},
		"ttl long":          {"[cluster]\netcd_endpoints=['e:1']\nlease_ttl='2h'\n", "cluster.lease_ttl"},
		"ttl bad":           {"[cluster]\netcd_endpoints=['e:1']\nlease_ttl='soon'\n", "cluster.lease_ttl"},
		"cert no key":       {"[cluster]\netcd_endpoints=['e:1']\ntls_cert='c.pem'\n", "cluster.tls_key"},
		"share short":       {"[cluster]\netcd_endpoints=['e:1']\nload_share_interval='9ms'\n", "cluster.load_share_interval"},
		"share long":        {"[cluster]\netcd_endpoints=['e:1']\nload_share_interval='11s'\n", "cluster.load_share_interval"},
		"share negative":    {"[cluster]\netcd_endpoints=['e:1']\nload_share_interval='-1s'\n", "cluster.load_share_interval"},
		"share bad":         {"[cluster]\netcd_endpoints=['e:1']\nload_share_interval='often'\n", "cluster.load_share_interval"},
		"advertise no port": {"[cluster]\netcd_endpoints=['e:1']\nadvertise_address='10.0.0.7'\n", "cluster.advertise_address"},
		"advertise empty":   {"[cluster]\netcd_endpoints=['e:1']\nadvertise_address=''\n", "cluster.advertise_address"},
		"user no password":  {"[cluster]\netcd_endpoints=['e:1']\nusername='u'\n", "cluster.password_env"},
		"password no user":  {"[cluster]\netcd_endpoints=['e:1']\npassword_env='P'\n", "cluster.username"},
		"password unset":    {"[cluster]\netcd_endpoints=['e:1']\nusername='u'\npassword_env='UNSET'\n", "cluster.password_env"},
		"unknown field":     {"[cluster]\netcd_endpoints=['e:1']\nreplicas=3\n", "cluster.replicas"},
		"inline password":   {"[cluster]\netcd_endpoints=['e:1']\nusername='u'\npassword='p'\n", "cluster.password"},
	} {
		_, err := Parse([]byte(c.toml), func(string) string { return "" })
		if err == nil || !strings.Contains(err.Error(), c.key) {
			t.Errorf("%s: %v, want an error naming %s", name, err, c.key)
		}
	}
}

func TestValidReplicaID(t *testing.T) {
	for id, ok := range map[string]bool{
		"gw-0:8080": true, "[::1]:8080": true, "a": true, strings.Repeat("x", 128): true,
		"": false, "a/b": false, "a b": false, "é": false, "a\x00": false, strings.Repeat("x", 129): false,
	} {
		if ValidReplicaID(id) != ok {
			t.Errorf("ValidReplicaID(%q) = %v, want %v", id, !ok, ok)
		}
	}
}

// TestClusterBoundaries: every bound of [cluster] admits exactly its limits.
func TestClusterBoundaries(t *testing.T) {
	for _, c := range []struct {
		toml string
		ok   bool
	}{
		{"lease_ttl='2s'", true}, {"lease_ttl='1h'", true}, {"lease_ttl='3601s'", false}, {"lease_ttl='1999ms'", false},
		{"etcd_endpoints=['e:65535']", true}, {"etcd_endpoints=['e:1']", true}, {"etcd_endpoints=['e:0']", false}, {"etcd_endpoints=['e:65536']", false},
		{"prefix='/" + strings.Repeat("p", 254) + "/'", true}, {"prefix='/" + strings.Repeat("p", 255) + "/'", false},
		{"prefix='/!~/'", true}, {"replica_id='!~'", true}, {"replica_id='a\u007f'", false},
	} {
		doc := "[cluster]\n" + c.toml + "\n"
		if !strings.Contains(c.toml, "etcd_endpoints") {
			doc += "etcd_endpoints=['e:1']\n"
		}
		_, err := Parse([]byte(doc), func(string) string { return "" })
		if (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok=%v", c.toml, err, c.ok)
		}
	}
}
