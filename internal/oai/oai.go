// Package oai reads what the gateway needs from OpenAI-style completions and
// chat request bodies, and rewrites their model, on every request.
//
// # How bodies are read
//
// A hand-written scanner (scan.go) validates the whole body in one pass:
// RFC 8259 grammar, UTF-8 inside strings, and encoding/json's nesting limit.
// On the way it notes where the top-level "model", "stream" and "user"
// values are, and it reads the prompt ("prompt", or "messages" for chat)
// as it validates it, checking its shape and writing the first PrefixLen
// bytes of its render. Nothing else is decoded, and nothing is allocated but
// the strings and slice that Parse returns (Model, User, PrefixKey) — and, for
// a body with an escaped top-level key or more than 16 of them, the set that
// finds a repeated key (dupkeys.go).
//
// encoding/json into a struct of json.RawMessage fields was measured as the
// alternative (the stdlib sub-benchmarks of BenchmarkParseChat and
// BenchmarkParseCompletions, written in ref_test.go): about ten times slower
// with 20 to 60 allocations per body, since it validates, then decodes, then
// each message is decoded again. It also matches keys case-insensitively,
// which the engines' parsers do not. RewriteModel needs the same scanner to
// keep every byte outside the model value, so both agree on what a key is:
// its decoded text compared exactly, so "mod\u0065l" is "model" and "Model"
// is not. Duplicate top-level keys (compared the same way, so "mod\u0065l"
// repeats "model" and "LogProbs" is another key than "logprobs") are refused
// by Parse, naming the key (R13.4): parsers disagree on which one wins, so the
// gateway could read one model or logprobs and the engine another. Nested
// objects may repeat keys; RewriteModel still rewrites every top-level
// "model". FuzzParse holds the scanner to an encoding/json reference on
// validity and on every field.
//
// Stricter than encoding/json in one way: invalid UTF-8 inside a string is a
// syntax error (RFC 8259 §8.1), as it is for the engines' parsers.
package oai

import (
	"bytes"
	"strconv"
	"unicode/utf8"
)

// Kind says which OpenAI endpoint a body was sent to.
type Kind int

const (
	// Completions is POST /v1/completions: the prompt is "prompt".
	Completions Kind = iota + 1
	// Chat is POST /v1/chat/completions: the prompt is "messages".
	Chat
)

func (k Kind) String() string {
	if k.Valid() {
		return endpoints[k].name
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// PrefixLen is the length of a prefix key in bytes (R4).
const PrefixLen = 64

// Request is what the gateway needs from an OpenAI completions/chat body.
// Every other field of the body passes through untouched (R5).
type Request struct {
	Model  string // required, non-empty
	Stream bool   // "stream"; false when absent or null
	User   string // "user"; empty when absent or null
	// PrefixKey is the first PrefixLen bytes of the rendered prompt (R4): a
	// byte cut that may split a UTF-8 sequence; it is a hash key, not text.
	// It is never nil and is owned by the caller.
	PrefixKey []byte
	// Cost is the request's size as admission and the token limit count it
	// (R20): every prompt of a batch, and what it may generate (cost.go).
	Cost Cost
	// The Responses API (R21): Store is whether the engine keeps the response
	// ("store", true when absent), Previous the "previous_response_id" ("" when
	// absent or null). Both are false and "" for other kinds.
	Store    bool
	Previous string
}

// Error is a problem with a request body that the client must fix; the HTTP
// adapter answers it with 400 invalid_request_error. Param names the
// offending field the way OpenAI's error "param" does ("model",
// "messages[2].role"); it is empty for syntax errors.
type Error struct {
	Param string
	Msg   string
}

func (e *Error) Error() string { return e.Msg }

func required(param string) error {
	return &Error{Param: param, Msg: `"` + param + `" is required`}
}

func mustBe(param, what string) error {
	return &Error{Param: param, Msg: `"` + param + `" must be ` + what}
}

// fields is what one scan of a body finds.
type fields struct {
	model, stream, user span // the values' spans; the last duplicate wins
	// The values that size the answer (cost.go): "n", "best_of", "max_tokens",
	// "max_completion_tokens".
	n, bestOf, maxTokens, maxCompletion span
	// The other endpoints (R21): the raw value of the kind's prompt field, and the Responses
	// API's "store", "previous_response_id" and "max_output_tokens".
	raw, store, previous, maxOutput span
	prompt                          bool  // the kind's prompt key was present
	promptErr                       error // a shape error in the last prompt value
	dupErr                          error // the first repeated top-level key (R13.4)
}

// str is a validated JSON string's contents (no quotes) and whether they
// hold escapes.
type str struct {
	span
	esc bool
}

func (p *prefix) writeStr(data []byte, v str) { p.writeString(data[v.start:v.end], v.esc) }

// isShape tells a shape error (a wrong type or a missing field, which has a
// Param) from a syntax error, which ends the scan.
func isShape(err error) bool {
	e, ok := err.(*Error)
	return ok && e.Param != ""
}

// scan validates body in one pass, finds the top-level fields and, for the
// kind's prompt key ("prompt" or "messages"), renders the prompt into p
// while it validates it. A later duplicate prompt key starts the render
// again. Syntax errors win over shape errors wherever they are.
func scan(kind Kind, body []byte, p *prefix) (fields, error) {
	var f fields
	s := scanner{data: body}
	it, err := openTop(&s)
	if err != nil {
		return f, err
	}
	var buf [6 * maxKeyLen]byte
	var keys keySet
	for {
		k, ok, err := it.next()
		if err != nil {
			return f, err
		}
		if !ok {
			break
		}
		if f.dupErr == nil {
			if name, dup := keys.add(body, k); dup {
				f.dupErr = duplicateKey(name)
			}
		}
		var v *span
		name := keyName(body, k, &buf)
		if kind > Chat && endpoints[kind].prompt != "" && string(name) == endpoints[kind].prompt {
			v = &f.raw
		}
		switch string(name) {
		case "model":
			v = &f.model
		case "stream":
			v = &f.stream
		case "user":
			v = &f.user
		case "n":
			v = &f.n
		case "best_of":
			v = &f.bestOf
		case "max_tokens":
			v = &f.maxTokens
		case "max_completion_tokens":
			v = &f.maxCompletion
		case "store":
			v = &f.store
		case "previous_response_id":
			v = &f.previous
		case "max_output_tokens":
			v = &f.maxOutput
		case "prompt":
			if kind == Completions {
				if err := f.readPrompt(kind, &s, p); err != nil {
					return f, err
				}
				continue
			}
		case "messages":
			if kind == Chat {
				if err := f.readPrompt(kind, &s, p); err != nil {
					return f, err
				}
				continue
			}
		}
		start := s.pos
		if err := s.value(1); err != nil {
			return f, err
		}
		if v != nil {
			*v = span{start, s.pos}
		}
	}
	return f, finish(&s)
}

// readPrompt renders the kind's prompt value at s.pos. On a shape error it
// keeps the error for later and validates the rest of the value.
func (f *fields) readPrompt(kind Kind, s *scanner, p *prefix) error {
	start := s.pos
	f.prompt = true
	p.n = 0
	p.size = promptSize{}
	if kind == Chat {
		f.promptErr = p.messages(s)
	} else {
		f.promptErr = p.prompt(s)
	}
	if f.promptErr == nil {
		return nil
	}
	if !isShape(f.promptErr) {
		return f.promptErr
	}
	s.pos = start
	return s.value(1)
}

// absent reports whether v is missing or JSON null; the gateway treats an
// explicit null like an omitted field, as OpenAI does for optional fields.
func absent(body []byte, v span) bool { return !v.present() || body[v.start] == 'n' }

// contents returns the raw contents of the string value v (no quotes) and
// whether it holds escapes.
func contents(body []byte, v span) ([]byte, bool) {
	raw := body[v.start+1 : v.end-1]
	return raw, bytes.IndexByte(raw, '\\') >= 0
}

func promptKey(kind Kind) string {
	if kind == Chat {
		return "messages"
	}
	return "prompt"
}

// Parse validates body as the given kind of request and returns what the
// gateway routes on. Errors are *Error with a message that says what is
// wrong, e.g. `invalid JSON: unexpected end of input`, `"model" must be a
// string`, `"model" is required`. Syntax errors come first, then a repeated
// top-level key, then model, stream, user, and the prompt.
func Parse(kind Kind, body []byte) (Request, error) {
	var arr [PrefixLen]byte
	p := prefix{b: arr[:]}
	return parse(kind, body, &p)
}

// ParseRendered is Parse that also returns the rendered prompt in full, up to max bytes (the
// prefix key is its first PrefixLen bytes), from the same single pass over body. The
// approximate prefix index (R10) hashes it and admission sizes the prompt by it.
func ParseRendered(kind Kind, body []byte, max int) (Request, []byte, error) {
	p := newRender(body, max)
	r, err := parse(kind, body, &p)
	if err != nil {
		return Request{}, nil, err
	}
	return r, p.b[:p.n:p.n], nil
}

// newRender is a prefix for a whole prompt of up to max bytes. A rendered prompt is never
// longer than its body (decoding only shortens strings, and the role, newlines and spaces a
// render adds replace at least as many bytes of JSON), so len(body) bytes always suffice.
func newRender(body []byte, limit int) prefix {
	return prefix{b: make([]byte, max(0, min(limit, len(body))))}
}

func parse(kind Kind, body []byte, p *prefix) (Request, error) {
	if !kind.Valid() || kind.Multipart() {
		return Request{}, &Error{Msg: "unknown request kind " + kind.String()}
	}
	f, err := scan(kind, body, p)
	if err != nil {
		return Request{}, err
	}
	if f.dupErr != nil {
		return Request{}, f.dupErr
	}
	var r Request
	if absent(body, f.model) {
		return Request{}, required("model")
	}
	if body[f.model.start] != '"' {
		return Request{}, mustBe("model", "a string")
	}
	if f.model.end-f.model.start == 2 {
		return Request{}, required("model")
	}
	if !absent(body, f.stream) && kind.Streams() {
		switch body[f.stream.start] {
		case 't':
			r.Stream = true
		case 'f':
		default:
			return Request{}, mustBe("stream", "a boolean")
		}
	}
	if !absent(body, f.user) && body[f.user.start] != '"' {
		return Request{}, mustBe("user", "a string")
	}
	if kind > Chat {
		if err := f.other(kind, body, p, &r); err != nil {
			return Request{}, err
		}
	} else if err := f.checkPrompt(kind); err != nil {
		return Request{}, err
	}
	// Strings are built last so that a rejected body allocates nothing but
	// its error.
	r.Model = decodeString(contents(body, f.model))
	if !absent(body, f.user) {
		r.User = decodeString(contents(body, f.user))
	}
	r.PrefixKey = p.key()
	if kind > Chat {
		r.Cost = f.otherCost(kind, body)
		return r, nil
	}
	r.Cost = f.cost(kind, body, p.size)
	return r, nil
}

func (f *fields) checkPrompt(kind Kind) error {
	if !f.prompt {
		return required(promptKey(kind))
	}
	return f.promptErr
}

// PrefixKey returns the first PrefixLen bytes of the rendered prompt of body
// (R4): the completions prompt, or the chat messages written as
// "role\ncontent\n" in order. It validates the body and the prompt like
// Parse, but not the other fields.
func PrefixKey(kind Kind, body []byte) ([]byte, error) {
	if kind != Completions && kind != Chat {
		return nil, &Error{Msg: "unknown request kind " + kind.String()}
	}
	var arr [PrefixLen]byte
	p := prefix{b: arr[:]}
	f, err := scan(kind, body, &p)
	if err != nil {
		return nil, err
	}
	if err := f.checkPrompt(kind); err != nil {
		return nil, err
	}
	return p.key(), nil
}

// prefix collects the first len(b) bytes of a rendered prompt: PrefixLen for the prefix key
// (in the caller's array, so Parse allocates nothing for it), more for ParseRendered. Writes
// past the end are dropped, so rendering can go on validating the rest of the prompt at the
// cost of scanning only.
type prefix struct {
	b []byte
	n int
	// size counts the whole prompt while it is read, whatever the render keeps
	// (cost.go).
	size promptSize
}

func (p *prefix) full() bool { return p.n == len(p.b) }

func (p *prefix) write(b []byte) { p.n += copy(p.b[p.n:], b) }

func (p *prefix) writeByte(c byte) {
	if p.n < len(p.b) {
		p.b[p.n] = c
		p.n++
	}
}

// writeString writes the decoded text of a validated JSON string's contents.
func (p *prefix) writeString(raw []byte, esc bool) {
	if !esc {
		p.write(raw)
		return
	}
	for i := 0; i < len(raw) && !p.full(); {
		j := i + bytes.IndexByte(raw[i:], '\\')
		if j < i {
			p.write(raw[i:])
			return
		}
		p.write(raw[i:j])
		r, n := escape(raw[j:])
		var tmp [utf8.UTFMax]byte
		p.write(tmp[:utf8.EncodeRune(tmp[:], r)])
		i = j + n
	}
}

// key is a copy of the first PrefixLen bytes.
func (p *prefix) key() []byte {
	k := make([]byte, min(p.n, PrefixLen))
	copy(k, p.b)
	return k
}

const (
	promptShape = "a string, an array of strings, an array of token ids, or an array of token-id arrays"
	tokenShape  = "a token id (an integer from 0 to 4294967295)"
)

// prompt reads a completions prompt at s.pos and renders it: a string; the
// first of an array of strings; or the token ids of a token-id array (or of
// the first of an array of them) as decimal numbers joined by single spaces.
func (p *prefix) prompt(s *scanner) error {
	switch s.data[s.pos] {
	case 'n':
		return required("prompt")
	case '"':
		raw, esc, err := s.str()
		p.writeStr(s.data, str{raw, esc})
		p.size.prompts, p.size.text = 1, raw.end-raw.start
		return err
	case '[':
	default:
		return mustBe("prompt", promptShape)
	}
	const (
		strs = iota + 1
		ids
		idArrays
	)
	it, err := openArr(s, 2)
	if err != nil {
		return err
	}
	mode := 0
	for n := 0; ; n++ {
		ok, err := it.next()
		if err != nil {
			return err
		}
		if !ok {
			if n == 0 {
				return mustBe("prompt", "non-empty")
			}
			return nil
		}
		m := 0
		switch c := s.data[s.pos]; {
		case c == '"':
			m = strs
		case c == '[':
			m = idArrays
		case c == '-' || isDigit(c):
			m = ids
		}
		if m == 0 || (mode != 0 && m != mode) {
			return mustBe("prompt", promptShape)
		}
		mode = m
		switch m {
		case strs:
			raw, esc, err := s.str()
			if err != nil {
				return err
			}
			if n == 0 {
				p.writeStr(s.data, str{raw, esc})
			}
			p.size.prompts++
			p.size.text += raw.end - raw.start
		case ids:
			if ok, err := p.tokenID(s, true, n > 0); err != nil || !ok {
				return orShape(err, mustBe("prompt["+strconv.Itoa(n)+"]", tokenShape))
			}
			p.size.prompts = 1 // one prompt of token ids
		case idArrays:
			if err := p.idArray(s, n); err != nil {
				return err
			}
			p.size.prompts++
		}
	}
}

// orShape returns the syntax error err if there is one, else shape.
func orShape(err, shape error) error {
	if err != nil {
		return err
	}
	return shape
}

// idArray reads the n-th element of a prompt that is an array of token-id
// arrays, and renders it when it is the first.
func (p *prefix) idArray(s *scanner, n int) error {
	it, err := openArr(s, 3)
	if err != nil {
		return err
	}
	for k := 0; ; k++ {
		ok, err := it.next()
		if err != nil {
			return err
		}
		if !ok {
			if k == 0 {
				return mustBe("prompt["+strconv.Itoa(n)+"]", "non-empty")
			}
			return nil
		}
		if ok, err := p.tokenID(s, n == 0, k > 0); err != nil || !ok {
			return orShape(err, mustBe("prompt["+strconv.Itoa(n)+"]["+strconv.Itoa(k)+"]", tokenShape))
		}
	}
}

// tokenID reads the value at s.pos, which must be a token id: an integer
// in [0, 2^32-1], the range of B1's prompt_ids. It writes the id, after a
// space if sep, when render is set.
func (p *prefix) tokenID(s *scanner, render, sep bool) (bool, error) {
	start := s.pos
	if c := s.data[start]; c != '-' && !isDigit(c) {
		return false, nil
	}
	if err := s.num(); err != nil {
		return false, err
	}
	b := s.data[start:s.pos]
	if !tokenID(b) {
		return false, nil
	}
	p.size.ids++
	if render {
		if sep {
			p.writeByte(' ')
		}
		p.write(b)
	}
	return true, nil
}

// tokenID reports whether the validated JSON number b is an integer in
// [0, 2^32-1]. JSON has no leading zeros, so comparing equal-length digit
// strings compares values.
func tokenID(b []byte) bool {
	if len(b) == 0 || len(b) > 10 {
		return false
	}
	for _, c := range b {
		if !isDigit(c) {
			return false
		}
	}
	return len(b) < 10 || string(b) <= "4294967295"
}

// messages reads chat messages at s.pos and renders them as
// "role\ncontent\n" each, in order.
func (p *prefix) messages(s *scanner) error {
	switch s.data[s.pos] {
	case 'n':
		return required("messages")
	case '[':
	default:
		return mustBe("messages", "a non-empty array of message objects")
	}
	it, err := openArr(s, 2)
	if err != nil {
		return err
	}
	for i := 0; ; i++ {
		ok, err := it.next()
		if err != nil {
			return err
		}
		if !ok {
			if i == 0 {
				return mustBe("messages", "a non-empty array of message objects")
			}
			return nil
		}
		if err := p.message(s, i); err != nil {
			return err
		}
	}
}

func msgParam(i int, field string) string {
	return "messages[" + strconv.Itoa(i) + "]" + field
}

// texts are the text parts of one message's content, in order. Only
// non-empty ones are kept, and at most limit of them (the render's byte limit):
// each adds at least one byte, so later ones cannot reach the render. The first
// PrefixLen live in the array; a longer render keeps the rest in more.
type texts struct {
	s     [PrefixLen]str
	more  []str
	n     int
	limit int
	bytes int // the bytes of every text part, as written in the body (kept or not)
}

func (t *texts) add(v str) {
	switch {
	case v.end <= v.start || t.n >= t.limit:
		return
	case t.n < len(t.s):
		t.s[t.n] = v
	default:
		t.more = append(t.more, v)
	}
	t.n++
}

func (t *texts) reset() { t.n, t.more, t.bytes = 0, t.more[:0], 0 }

// each calls f with the kept parts in order.
func (t *texts) each(f func(str)) {
	for _, v := range t.s[:min(t.n, len(t.s))] {
		f(v)
	}
	for _, v := range t.more {
		f(v)
	}
}

// message reads message i at s.pos. Its members may come in any order, so
// it keeps the role and content (the last of duplicates) and renders them
// once the object ends. Content is a string, null (or absent: an assistant
// turn with tool calls), or an array of parts whose "text" parts count.
func (p *prefix) message(s *scanner, i int) error {
	if s.data[s.pos] != '{' {
		return mustBe(msgParam(i, ""), "an object")
	}
	it, err := openObj(s, 3)
	if err != nil {
		return err
	}
	var (
		role       span
		content    str  // when a string
		isParts    bool // content is an array of parts, kept in parts
		parts      texts
		contentErr error
		buf        [6 * maxKeyLen]byte
	)
	parts.limit = len(p.b)
	for {
		k, ok, err := it.next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		start := s.pos
		switch string(keyName(s.data, k, &buf)) {
		case "role":
			if err := s.value(3); err != nil {
				return err
			}
			role = span{start, s.pos}
			continue
		case "content":
			content, isParts, contentErr = str{}, false, nil
			parts.reset()
			switch s.data[start] {
			case '"':
				raw, esc, err := s.str()
				if err != nil {
					return err
				}
				content = str{raw, esc}
				continue
			case '[':
				isParts = true
				if contentErr = parts.read(s, i); contentErr == nil {
					continue
				}
				if !isShape(contentErr) {
					return contentErr
				}
				s.pos = start // validate what is left of it below
			case 'n':
			default:
				contentErr = mustBe(msgParam(i, ".content"), "a string, null, or an array of content parts")
			}
		}
		if err := s.value(3); err != nil {
			return err
		}
	}
	if absent(s.data, role) {
		return required(msgParam(i, ".role"))
	}
	if s.data[role.start] != '"' {
		return mustBe(msgParam(i, ".role"), "a string")
	}
	if contentErr != nil {
		return contentErr
	}
	// The message as the render writes it, "role\ncontent\n", with its strings as written
	// in the body: the role's span holds its two quotes, as many bytes as the two newlines.
	p.size.prompts = 1
	p.size.text += role.end - role.start
	if isParts {
		p.size.text += parts.bytes
	} else {
		p.size.text += content.end - content.start
	}
	if p.full() {
		return nil
	}
	p.writeString(contents(s.data, role))
	p.writeByte('\n')
	if isParts {
		parts.each(func(t str) { p.writeStr(s.data, t) })
	} else {
		p.writeStr(s.data, content)
	}
	p.writeByte('\n')
	return nil
}

// read reads the content-parts array at s.pos of message i, keeping the
// text of its "text" parts; other part types (images, audio, …) are skipped.
func (t *texts) read(s *scanner, i int) error {
	it, err := openArr(s, 4)
	if err != nil {
		return err
	}
	var buf [6 * maxKeyLen]byte
	for j := 0; ; j++ {
		ok, err := it.next()
		if err != nil || !ok {
			return err
		}
		param := func(field string) string {
			return msgParam(i, ".content["+strconv.Itoa(j)+"]"+field)
		}
		if s.data[s.pos] != '{' {
			return mustBe(param(""), "an object")
		}
		var typ, text span
		pit, err := openObj(s, 5)
		if err != nil {
			return err
		}
		for {
			k, ok, err := pit.next()
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			var v *span
			switch string(keyName(s.data, k, &buf)) {
			case "type":
				v = &typ
			case "text":
				v = &text
			}
			start := s.pos
			if err := s.value(5); err != nil {
				return err
			}
			if v != nil {
				*v = span{start, s.pos}
			}
		}
		if absent(s.data, typ) {
			return required(param(".type"))
		}
		if s.data[typ.start] != '"' {
			return mustBe(param(".type"), "a string")
		}
		if raw, esc := contents(s.data, typ); string(name(raw, esc, &buf)) != "text" {
			continue
		}
		if absent(s.data, text) || s.data[text.start] != '"' {
			return mustBe(param(".text"), "a string")
		}
		_, esc := contents(s.data, text)
		t.bytes += text.end - text.start - 2
		t.add(str{span{text.start + 1, text.end - 1}, esc})
	}
}
