package httpapi

import (
	"github.com/tlgw/tlgw/internal/ratelimit"

	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"

	"github.com/tlgw/tlgw/internal/config"
	"github.com/tlgw/tlgw/internal/errs"
)

// scope is a bit set of the key scopes of SPEC B2.
type scope uint8

const (
	scopeInference scope = 1 << iota
	scopeAdmin
	scopeDebug
)

func parseScope(s string) scope {
	switch s {
	case "inference":
		return scopeInference
	case "admin":
		return scopeAdmin
	case "debug":
		return scopeDebug
	}
	return 0
}

type apiKey struct {
	digest [sha256.Size]byte
	scopes scope
	class  string // the admission class of the key's requests ("" = the default class)
	limits ratelimit.Limits
}

// keyMatch is what a request's key grants: its scopes and class, and (index ≥ 0) which
// configured key it is, with that key's limits (rpm, tpm, max_in_flight). Open mode has
// index −1.
type keyMatch struct {
	scopes scope
	class  string
	index  int
	limits ratelimit.Limits
}

// keyring checks bearer keys. Keys are compared as SHA-256 digests with
// subtle.ConstantTimeCompare against every configured key, so neither the position of the
// first differing byte nor which key matched shows in the timing.
type keyring struct {
	keys []apiKey // the configured [[auth.keys]], fixed for the server's life
}

func newKeyring(keys []config.Key) *keyring {
	kr := &keyring{}
	for _, k := range keys {
		var sc scope
		for _, s := range k.Scopes {
			sc |= parseScope(s)
		}
		kr.keys = append(kr.keys, apiKey{digest: sha256.Sum256([]byte(k.Key)), scopes: sc, class: k.Class,
			limits: ratelimit.Limits{RPM: k.RPM, TPM: k.TPM, InFlight: k.MaxInFlight}})
	}
	return kr
}

// open reports whether the gateway runs without auth (no keys configured).
func (kr *keyring) open() bool { return len(kr.keys) == 0 }

// authorize returns what the request's key grants, or an error naming what is wrong.
func (kr *keyring) authorize(r *http.Request, need scope) (keyMatch, error) {
	if kr.open() {
		return keyMatch{scopes: scopeInference | scopeAdmin, index: -1}, nil
	}
	h := r.Header.Get("Authorization")
	token, ok := strings.CutPrefix(h, "Bearer ")
	if h == "" && need == scopeInference {
		// R21: Anthropic's clients send their key as x-api-key; it is a key like a bearer one,
		// for inference only (the admin API takes the Authorization header alone).
		token = r.Header.Get("X-Api-Key")
		ok = token != ""
	}
	if !ok || token == "" {
		return keyMatch{}, fmt.Errorf("missing bearer API key in the Authorization header: %w", errs.ErrInvalidAPIKey)
	}
	d := sha256.Sum256([]byte(token))
	m := keyMatch{index: -1}
	matched := 0
	for i := range kr.keys {
		eq := subtle.ConstantTimeCompare(d[:], kr.keys[i].digest[:])
		matched |= eq
		m.scopes |= kr.keys[i].scopes & scope(-eq) // eq is 0 or 1: mask is 0x00 or 0xff
		if eq == 1 {
			m.class, m.index, m.limits = kr.keys[i].class, i, kr.keys[i].limits
		}
	}
	if matched == 0 {
		return keyMatch{}, fmt.Errorf("the API key is not valid: %w", errs.ErrInvalidAPIKey)
	}
	if m.scopes&need == 0 {
		return keyMatch{scopes: m.scopes}, fmt.Errorf("the API key lacks the %q scope: %w", scopeName(need), errs.ErrInsufficientScope)
	}
	return m, nil
}

func scopeName(s scope) string {
	switch s {
	case scopeInference:
		return "inference"
	case scopeAdmin:
		return "admin"
	case scopeDebug:
		return "debug"
	}
	return "unknown"
}
