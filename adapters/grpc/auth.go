package grpcapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/tlgw/tlgw/actors/registry"
)

// Token is one registry token ([[registry.tokens]], R13.1): the secret engines send as
// `authorization: Bearer <secret>` metadata, and what workers sent with it may be.
type Token struct {
	Secret string
	// Models are path.Match globs the worker's model and each of its LoRA adapters must
	// match; empty = any model.
	Models []string
	// IDPrefix is what the worker id must start with.
	IDPrefix string
	// MaxWorkers caps the workers registered with the token at once (0 = only the registry's
	// max_workers).
	MaxWorkers int
}

// Auth is the registry's authentication: tokens, client certificates, or neither (open).
type Auth struct {
	tokens [][sha256.Size]byte
	grants []Token
	// certs: the listener verifies client certificates (client_ca); the verified
	// certificate's identity is a credential.
	certs bool
	// quotas[i] is token i's quota (nil when it has none); certMax caps the workers of one
	// certificate identity (0 = none).
	quotas  [][]registry.Quota
	certMax int
}

// NewAuth builds the registry's authentication. With no tokens and certs false the registry
// is open: every heartbeat has the empty credential.
func NewAuth(tokens []Token, certs bool) *Auth {
	a := &Auth{certs: certs, grants: tokens}
	for i, t := range tokens {
		a.tokens = append(a.tokens, sha256.Sum256([]byte(t.Secret)))
		var q []registry.Quota
		if t.MaxWorkers > 0 {
			q = []registry.Quota{{Key: "token:" + strconv.Itoa(i), Max: t.MaxWorkers}}
		}
		a.quotas = append(a.quotas, q)
	}
	return a
}

// WithCertificateQuota caps the workers each client-certificate identity registers at once at
// n (0 = no cap; [registry] certificate_max_workers) and returns a.
func (a *Auth) WithCertificateQuota(n int) *Auth {
	a.certMax = n
	return a
}

// Open reports whether anyone may heartbeat.
func (a *Auth) Open() bool { return a == nil || (len(a.tokens) == 0 && !a.certs) }

// errUnauthenticated and errPermission tell the handler which gRPC code to answer.
var (
	errUnauthenticated = errors.New("unauthenticated")
	errPermission      = errors.New("permission denied")
)

// caller is who sent a heartbeat: the credential the registry binds worker ids to, and the
// token's grant (nil when no token is configured).
type caller struct {
	credential string
	grant      *Token
	// quotas are the caps the caller's workers count against (R20).
	quotas []registry.Quota
}

// authenticate names the caller of ctx. With tokens configured, a known bearer token is
// required; with client certificates, the verified certificate's identity joins the
// credential (both layers must pass when both are configured).
func (a *Auth) authenticate(ctx context.Context) (caller, error) {
	if a.Open() {
		return caller{}, nil
	}
	var parts []string
	var c caller
	if len(a.tokens) > 0 {
		i, err := a.token(ctx)
		if err != nil {
			return caller{}, err
		}
		c.grant = &a.grants[i]
		c.quotas = a.quotas[i]
		parts = append(parts, "token:"+strconv.Itoa(i))
	}
	if a.certs {
		id, err := certIdentity(ctx)
		if err != nil {
			return caller{}, err
		}
		parts = append(parts, "cert:"+id)
		if a.certMax > 0 {
			c.quotas = append(c.quotas[:len(c.quotas):len(c.quotas)], registry.Quota{Key: "cert:" + id, Max: a.certMax})
		}
	}
	c.credential = strings.Join(parts, " ")
	return c, nil
}

// token finds the configured token the request carries, comparing digests in constant time
// against every token (no early exit, no length leak).
func (a *Auth) token(ctx context.Context) (int, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return 0, fmt.Errorf("%w: no authorization metadata (want \"Bearer <token>\")", errUnauthenticated)
	}
	scheme, secret, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || secret == "" {
		return 0, fmt.Errorf("%w: authorization metadata is not \"Bearer <token>\"", errUnauthenticated)
	}
	sum := sha256.Sum256([]byte(secret))
	found := -1
	for i := range a.tokens {
		if subtle.ConstantTimeCompare(sum[:], a.tokens[i][:]) == 1 && found < 0 {
			found = i
		}
	}
	if found < 0 {
		return 0, fmt.Errorf("%w: unknown registry token", errUnauthenticated)
	}
	return found, nil
}

// certIdentity is the verified client certificate's CN, else its first DNS SAN.
func certIdentity(ctx context.Context) (string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", fmt.Errorf("%w: no peer", errUnauthenticated)
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return "", fmt.Errorf("%w: no verified client certificate", errUnauthenticated)
	}
	id := Identity(ti.State.VerifiedChains[0][0])
	if id == "" {
		return "", fmt.Errorf("%w: the client certificate has neither a CN nor a DNS SAN", errUnauthenticated)
	}
	return id, nil
}

// Identity is a client certificate's credential name: its subject CN, else its first DNS SAN.
func Identity(c *x509.Certificate) string {
	if c.Subject.CommonName != "" {
		return c.Subject.CommonName
	}
	if len(c.DNSNames) > 0 {
		return c.DNSNames[0]
	}
	return ""
}

// grants reports whether model matches one of the token's model globs.
func (t *Token) grants(model string) bool {
	for _, glob := range t.Models {
		if ok, _ := path.Match(glob, model); ok {
			return true
		}
	}
	return false
}

// permit checks a worker's id, model and LoRA adapters against the caller's token grant: an
// adapter is a model id clients ask for (R21), so each must match one of the token's model
// globs like the base model (a token for smol* cannot advertise an adapter named as another
// tenant's model and draw its requests).
func (c caller) permit(id, model string, adapters []string) error {
	g := c.grant
	if g == nil {
		return nil
	}
	if !strings.HasPrefix(id, g.IDPrefix) {
		return fmt.Errorf("%w: worker_id %q does not start with the token's id_prefix %q", errPermission, id, g.IDPrefix)
	}
	if len(g.Models) == 0 {
		return nil
	}
	if !g.grants(model) {
		return fmt.Errorf("%w: the token is not granted the model %q", errPermission, model)
	}
	for _, a := range adapters {
		if !g.grants(a) {
			return fmt.Errorf("%w: the token is not granted the model %q (a LoRA adapter)", errPermission, a)
		}
	}
	return nil
}
