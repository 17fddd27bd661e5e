package oai

// RenderPrompt renders a request's prompt as the prefix key does (R4: the completions prompt,
// or "role\ncontent\n" per chat message) but in full, up to max bytes, with the same scanner
// (so the two always agree). It checks the prompt's shape but not the other fields, and
// returns nil for a body whose prompt does not parse.
func RenderPrompt(kind Kind, body []byte, max int) []byte {
	if !kind.Valid() || kind.Multipart() {
		return nil
	}
	p := newRender(body, max)
	f, err := scan(kind, body, &p)
	if err != nil {
		return nil
	}
	if kind > Chat {
		p.write(f.rawPrompt(body))
	} else if f.checkPrompt(kind) != nil {
		return nil
	}
	return p.b[:p.n]
}
