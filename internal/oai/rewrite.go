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
	var qBuf [128]byte
	return setField(body, "model", quote(qBuf[:0], model), true)
}

// SetField returns a new body in which the value of every top-level key is the raw JSON value
// (which the caller guarantees is valid JSON), or, when the body has no such key, the pair is
// added as the object's first member. Every other byte is the input's. The gateway uses it to
// force logprobs on for a cascade step and to fix the seed of a disaggregated request.
func SetField(body []byte, key string, value []byte) ([]byte, error) {
	return setField(body, key, value, false)
}

func setField(body []byte, name string, q []byte, mustExist bool) ([]byte, error) {
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
		if string(keyName(body, k, &buf)) == name {
			spans = append(spans, span{start, s.pos})
		}
	}
	if err := finish(&s); err != nil {
		return nil, err
	}
	if len(spans) == 0 {
		if mustExist {
			return nil, required(name)
		}
		return insertFirst(body, name, q), nil
	}
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

// insertFirst adds "name":value as the first member of the (valid) top-level object.
func insertFirst(body []byte, name string, value []byte) []byte {
	open := 0
	for body[open] != '{' {
		open++
	}
	rest := open + 1
	for rest < len(body) && (body[rest] == ' ' || body[rest] == '\t' || body[rest] == '\n' || body[rest] == '\r') {
		rest++
	}
	var kBuf [64]byte
	k := quote(kBuf[:0], name)
	out := make([]byte, 0, len(body)+len(k)+len(value)+2)
	out = append(out, body[:open+1]...)
	out = append(out, k...)
	out = append(out, ':')
	out = append(out, value...)
	if body[rest] != '}' {
		out = append(out, ',')
	}
	return append(out, body[open+1:]...)
}

// DeleteField returns a new body without any top-level member whose key is name (compared on
// the decoded key, as SetField does); every other byte is the input's. A body without the key
// comes back as it is. The gateway uses it to take stream_options out of a vLLM prefill call
// (R22), which must not be streamed.
func DeleteField(body []byte, name string) ([]byte, error) {
	type member struct{ start, end int } // from the key's opening quote to the value's end
	var members []member
	var drop []int
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
		if err := s.value(1); err != nil {
			return nil, err
		}
		if string(keyName(body, k, &buf)) == name {
			drop = append(drop, len(members))
		}
		members = append(members, member{k.start - 1, s.pos})
	}
	if err := finish(&s); err != nil {
		return nil, err
	}
	if len(drop) == 0 {
		return body, nil
	}
	out := make([]byte, 0, len(body))
	prev := 0
	for _, i := range drop {
		from, to := members[i].start, members[i].end
		switch {
		case i > 0:
			from = members[i-1].end // the comma before it goes with it
		case i+1 < len(members):
			to = members[i+1].start // the first member: the comma after it goes with it
		}
		from = max(from, prev)
		out = append(out, body[prev:from]...)
		prev = to
	}
	return append(out, body[prev:]...), nil
}
