package cluster

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/tlgw/tlgw/internal/config"
)

// tlsConfig builds the etcd connection's TLS from [cluster] tls_ca, tls_cert and tls_key
// (nil: plaintext). A bad file fails at start-up.
func tlsConfig(c config.Cluster) (*tls.Config, error) {
	if !c.TLS() {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.TLSCA != "" {
		pem, err := os.ReadFile(c.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("cluster.tls_ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("cluster.tls_ca: %s holds no PEM certificate", c.TLSCA)
		}
		tc.RootCAs = pool
	}
	if c.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("cluster.tls_cert/tls_key: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}
