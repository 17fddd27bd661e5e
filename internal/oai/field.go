package oai

// Field returns the raw JSON value of the top-level key name (compared exactly on the decoded
// key, as Parse does: "LogProbs" is not "logprobs") and whether it is there. The gateway reads
// the client's own fields with it, so it sees a body as the engines' case-sensitive parsers do;
// encoding/json's case-insensitive matching would not. body is one Parse accepted (no repeated
// keys); anything else reports the key as absent.
func Field(body []byte, name string) ([]byte, bool) {
	s := scanner{data: body}
	it, err := openTop(&s)
	if err != nil {
		return nil, false
	}
	var buf [6 * maxKeyLen]byte
	for {
		k, ok, err := it.next()
		if err != nil || !ok {
			return nil, false
		}
		start := s.pos
		if err := s.value(1); err != nil {
			return nil, false
		}
		if len(name) <= maxKeyLen && string(keyName(body, k, &buf)) == name {
			return body[start:s.pos], true
		}
		if len(name) > maxKeyLen && decodeString(body[k.start:k.end], k.esc) == name {
			return body[start:s.pos], true
		}
	}
}
