package oai

import (
	"slices"
	"strings"
	"testing"
)

// TestEndpointCatalogue: every kind has a unique name and path, names map back to their kinds,
// and nothing outside the catalogue passes for an endpoint.
func TestEndpointCatalogue(t *testing.T) {
	ks := Kinds()
	if len(ks) != int(MaxKind) || ks[0] != Completions || ks[len(ks)-1] != Translations {
		t.Fatalf("kinds %v", ks)
	}
	names, paths := map[string]bool{}, map[string]bool{}
	for _, k := range ks {
		if !k.Valid() || k.Endpoint() == "" || !strings.HasPrefix(k.Path(), "/") || names[k.Endpoint()] || paths[k.Path()] {
			t.Fatalf("%d: name %q path %q", k, k.Endpoint(), k.Path())
		}
		names[k.Endpoint()], paths[k.Path()] = true, true
		if got, ok := KindByEndpoint(k.Endpoint()); !ok || got != k {
			t.Fatalf("KindByEndpoint(%q) = %v, %v", k.Endpoint(), got, ok)
		}
		if k.String() != k.Endpoint() {
			t.Fatalf("String %q", k.String())
		}
	}
	for _, k := range []Kind{0, MaxKind + 1, -1} {
		if k.Valid() || k.Endpoint() != "" || k.Path() != "" || k.Streams() || k.Multipart() || EndpointSet(0).With(k) != 0 {
			t.Fatalf("kind %d passes for an endpoint", k)
		}
	}
	if _, ok := KindByEndpoint("images"); ok {
		t.Fatal("an unknown name found a kind")
	}
	if !Transcriptions.Multipart() || Embeddings.Multipart() || !Responses.Streams() || Rerank.Streams() {
		t.Fatal("stream and form flags")
	}
}

// TestEndpointSets: the empty set serves everything and lists nothing; a listed set serves
// exactly its members.
func TestEndpointSets(t *testing.T) {
	var none EndpointSet
	for _, k := range Kinds() {
		if !none.Serves(k) || none.Has(k) {
			t.Fatalf("the empty set and %v", k)
		}
	}
	if none.String() != "" || none.Names() != nil {
		t.Fatalf("empty set %q %v", none.String(), none.Names())
	}
	s := none.With(Translations).With(Completions).With(Completions)
	if s.String() != "completions,translations" || !slices.Equal(s.Names(), []string{"completions", "translations"}) {
		t.Fatalf("set %q %v", s.String(), s.Names())
	}
	for _, k := range Kinds() {
		want := k == Completions || k == Translations
		if s.Has(k) != want || s.Serves(k) != want {
			t.Fatalf("%v in %v: %v", k, s, s.Has(k))
		}
	}
	if s.Has(0) || s.Serves(MaxKind+1) {
		t.Fatal("a set serves a non-kind")
	}
}

// TestParseEndpoints: a worker's list becomes a set; unknown names are counted, not errors;
// too many or bad names are refused.
func TestParseEndpoints(t *testing.T) {
	s, unknown, err := ParseEndpoints([]string{"chat", "embeddings", "images", "chat"})
	if err != nil || unknown != 1 || s != EndpointSet(0).With(Chat).With(Embeddings) {
		t.Fatalf("%v %d %v", s, unknown, err)
	}
	if s, _, err := ParseEndpoints(nil); err != nil || s != 0 {
		t.Fatalf("none: %v %v", s, err)
	}
	many := make([]string, MaxEndpointNames)
	for i := range many {
		many[i] = "chat"
	}
	if _, _, err := ParseEndpoints(many); err != nil {
		t.Fatalf("%d names: %v", len(many), err)
	}
	if _, _, err := ParseEndpoints(append(many, "chat")); err == nil {
		t.Fatal("more than 64 names accepted")
	}
	for _, bad := range []string{"", strings.Repeat("x", 65)} {
		if _, _, err := ParseEndpoints([]string{bad}); err == nil {
			t.Fatalf("name %q accepted", bad)
		}
	}
	if _, _, err := ParseEndpoints([]string{strings.Repeat("x", 64)}); err != nil {
		t.Fatalf("a 64-byte name: %v", err)
	}
}

// TestEndpointSetFull: the empty set and the set of every kind are full; one short of every
// kind is not; AllEndpoints holds every valid kind and nothing else.
func TestEndpointSetFull(t *testing.T) {
	var every EndpointSet
	for k := Completions; k <= MaxKind; k++ {
		every = every.With(k)
	}
	if every != AllEndpoints {
		t.Fatalf("AllEndpoints %b, every kind %b", AllEndpoints, every)
	}
	if !EndpointSet(0).Full() || !AllEndpoints.Full() {
		t.Fatal("the empty set or every kind is not full")
	}
	for k := Completions; k <= MaxKind; k++ {
		if short := AllEndpoints &^ (1 << uint(k)); short.Full() {
			t.Fatalf("every kind but %s is full", k.Endpoint())
		}
		if one := EndpointSet(0).With(k); one.Full() {
			t.Fatalf("%s alone is full", k.Endpoint())
		}
	}
}
