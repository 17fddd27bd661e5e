package oai

// RewriteModel returns a new body in which the value of every top-level
// "model" key (compared on the decoded key, so "mod\u0065l" counts) is
// replaced by model as a JSON string. Every other byte is the input's:
// whitespace, key order, number spelling, escapes, and "model" keys inside
// nested objects (R5: "every other field byte-for-byte as sent").
//
// body is normally one that Parse accepted; anything else gets an error, never
// a panic: malformed JSON, a non-object, or an object without a top-level
// "model". body is not modified; the result is one allocation.
func RewriteModel(body []byte, model string) ([]byte, error) {
	var spanBuf [4]span
	spans := spanBuf[:0]
	s := scanner{data: body}
	it, err := openTop(&s)
	if err != nil {
		return nil, err
	}
	var buf [6 * maxKeyLen]byte
	for {
		k, ok, err := it.next()
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		start := s.pos
		if err := s.value(1); err != nil {
			return nil, err
		}
		if string(keyName(body, k, &buf)) == "model" {
			spans = append(spans, span{start, s.pos})
		}
	}
	if err := finish(&s); err != nil {
		return nil, err
	}
	if len(spans) == 0 {
		return nil, required("model")
	}

	var qBuf [128]byte
	q := quote(qBuf[:0], model)
	size := len(body)
	for _, sp := range spans {
		size += len(q) - (sp.end - sp.start)
	}
	out := make([]byte, 0, size)
	prev := 0
	for _, sp := range spans {
		out = append(out, body[prev:sp.start]...)
		out = append(out, q...)
		prev = sp.end
	}
	return append(out, body[prev:]...), nil
}
