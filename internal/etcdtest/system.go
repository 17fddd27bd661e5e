package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// System is the machine's own etcd binary (Debian's etcd-server: 3.4.23 in Debian 12) run as
// a process, to prove the product against etcd's 3.4 API and not only the embedded 3.7.
type System struct {
	t          testing.TB
	bin        string
	dir        string
	clientAddr string
	peerAddr   string
	args       []string
	cmd        *exec.Cmd
	exited     chan struct{}
}

// SystemBin is the etcd binary: $TLGW_ETCD_BIN, else etcd on PATH. A missing binary fails the
// test (CI installs Debian's etcd-server; a silent skip would hide the 3.4 check).
func SystemBin(t testing.TB) string {
	t.Helper()
	if b := os.Getenv("TLGW_ETCD_BIN"); b != "" {
		return b
	}
	b, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatalf("etcdtest: no etcd binary on PATH: install Debian's etcd-server (`apt-get install etcd-server`; .ci/run does) or set TLGW_ETCD_BIN")
	}
	return b
}

// TLS is a CA and the certificates a TLS etcd and its client need, as PEM files.
type TLS struct {
	CA, ServerCert, ServerKey, ClientCert, ClientKey string
}

// StartSystem runs the etcd binary on two free loopback ports with a fresh data dir; with
// tls set, clients must use TLS and present a certificate the CA signed. It is stopped when
// the test ends.
func StartSystem(t testing.TB, tls *TLS) *System {
	t.Helper()
	s := &System{t: t, bin: SystemBin(t), dir: t.TempDir(), clientAddr: freeAddr(t), peerAddr: freeAddr(t)}
	scheme := "http"
	if tls != nil {
		scheme = "https"
		s.args = append(s.args, "--cert-file", tls.ServerCert, "--key-file", tls.ServerKey,
			"--trusted-ca-file", tls.CA, "--client-cert-auth")
	}
	cu, pu := scheme+"://"+s.clientAddr, "http://"+s.peerAddr
	s.args = append(s.args, "--name", "tlgw-test", "--data-dir", filepath.Join(s.dir, "data"),
		"--listen-client-urls", cu, "--advertise-client-urls", cu,
		"--listen-peer-urls", pu, "--initial-advertise-peer-urls", pu,
		"--initial-cluster", "tlgw-test="+pu, "--heartbeat-interval", "10", "--election-timeout", "100",
		"--log-level", "error")
	s.start()
	t.Cleanup(s.Stop)
	return s
}

// Endpoint is the client address (host:port).
func (s *System) Endpoint() string { return s.clientAddr }

func (s *System) start() {
	s.t.Helper()
	s.cmd = exec.Command(s.bin, s.args...)
	s.cmd.Env = append(os.Environ(), "ETCD_UNSUPPORTED_ARCH=")
	var logs strings.Builder
	s.cmd.Stdout, s.cmd.Stderr = &logs, &logs
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("etcdtest: start %s: %v", s.bin, err)
	}
	s.exited = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.exited) }()
	// Ready when the client port accepts (a bounded poll).
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("tcp", s.clientAddr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-s.exited:
			s.t.Fatalf("etcdtest: %s exited: %s", s.bin, logs.String())
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			s.Stop()
			s.t.Fatalf("etcdtest: %s did not listen within 20s", s.bin)
		}
	}
}

// Stop kills the process (its data stays for Restart).
func (s *System) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
	s.cmd = nil
}

// Restart starts the process again on its address and data.
func (s *System) Restart() {
	if s.cmd == nil {
		s.start()
	}
}

// NewTLS writes a fresh CA, a server certificate for 127.0.0.1 and a client certificate
// (CN "tlgw") under the test's temp dir.
func NewTLS(t testing.TB) *TLS {
	t.Helper()
	dir := t.TempDir()
	caKey, caCert := newCert(t, nil, nil, &x509.Certificate{
		Subject: pkix.Name{CommonName: "tlgw test CA"}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	})
	out := &TLS{CA: writePEM(t, dir, "ca.pem", "CERTIFICATE", caCert.Raw)}
	sk, sc := newCert(t, caKey, caCert, &x509.Certificate{
		Subject: pkix.Name{CommonName: "etcd"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	})
	out.ServerCert, out.ServerKey = writePEM(t, dir, "server.pem", "CERTIFICATE", sc.Raw), writeKey(t, dir, "server-key.pem", sk)
	ck, cc := newCert(t, caKey, caCert, &x509.Certificate{
		Subject: pkix.Name{CommonName: "tlgw"}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	out.ClientCert, out.ClientKey = writePEM(t, dir, "client.pem", "CERTIFICATE", cc.Raw), writeKey(t, dir, "client-key.pem", ck)
	return out
}

var serial atomic.Int64

func newCert(t testing.TB, parentKey *ecdsa.PrivateKey, parent, tmpl *x509.Certificate) (*ecdsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl.SerialNumber = big.NewInt(serial.Add(1))
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert
}

func writePEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func writeKey(t testing.TB, dir, name string, k *ecdsa.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return writePEM(t, dir, name, "EC PRIVATE KEY", der)
}
