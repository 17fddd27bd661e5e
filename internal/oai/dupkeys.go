package oai

import "strconv"

// keySet finds a repeated top-level key (R13.4). Keys compare on their decoded text, exactly
// as the scanner matches names: "mod\u0065l" repeats "model", "Model" does not (JSON keys are
// case-sensitive, as they are for the engines' parsers). A body of a few unescaped keys is
// checked in place without allocating; an escaped key or a body with more keys than fit
// moves the set to a map.
type keySet struct {
	small [16]span // raw contents of unescaped keys, which are their decoded text
	n     int
	big   map[string]struct{}
}

// add records key k of data and reports the decoded key when it was already there.
func (ks *keySet) add(data []byte, k key) (dup []byte, ok bool) {
	raw := data[k.start:k.end]
	if ks.big == nil && !k.esc && ks.n < len(ks.small) {
		for _, sp := range ks.small[:ks.n] {
			if string(data[sp.start:sp.end]) == string(raw) {
				return raw, true
			}
		}
		ks.small[ks.n] = k.span
		ks.n++
		return nil, false
	}
	if ks.big == nil {
		ks.big = make(map[string]struct{}, 2*len(ks.small))
		for _, sp := range ks.small[:ks.n] {
			ks.big[string(data[sp.start:sp.end])] = struct{}{}
		}
	}
	name := raw
	if k.esc {
		name = appendUnquoted(make([]byte, 0, len(raw)), raw)
	}
	if _, seen := ks.big[string(name)]; seen {
		return name, true
	}
	ks.big[string(name)] = struct{}{}
	return nil, false
}

// maxQuotedKey bounds how much of a repeated key its error quotes.
const maxQuotedKey = 64

// duplicateKey is the error of a repeated top-level key: the body is ambiguous (encoding/json
// and Python keep the last, other parsers the first), so the gateway could rewrite one model
// and the engine read another.
func duplicateKey(name []byte) error {
	shown := string(name)
	if len(shown) > maxQuotedKey {
		shown = shown[:maxQuotedKey] + "…"
	}
	return &Error{Param: shown, Msg: "duplicate key " + strconv.Quote(shown) + " in the request body"}
}
