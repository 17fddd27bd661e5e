package oai

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/textproto"
)

// The audio endpoints (R21) take multipart/form-data: the file and the request's fields, the
// model among them. The gateway reads the fields it routes on ("model", "stream") with the
// standard library's multipart reader over the body it already holds (bounded by
// max_body_bytes), skips the file's bytes, and relays the body byte for byte; only when an
// attempt's served model differs from the one asked for is the model field's value replaced
// in place (RewriteFormField), every other byte kept.

// Multipart bounds: the parts of one form and the bytes of a field the gateway reads.
const (
	MaxFormParts      = 64
	maxFormFieldBytes = MaxNameBytes
)

// FormBoundary checks that contentType is multipart/form-data with a usable boundary and
// returns the boundary.
func FormBoundary(contentType string) (string, error) {
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != "multipart/form-data" {
		return "", &Error{Param: "Content-Type", Msg: "the body must be multipart/form-data"}
	}
	b := params["boundary"]
	if b == "" || len(b) > 70 {
		return "", &Error{Param: "Content-Type", Msg: "multipart/form-data needs a boundary of 1 to 70 characters"}
	}
	return b, nil
}

// ParseMultipart reads what the gateway routes on from an audio request's form: "model"
// (required, one value, 1 to 256 printable ASCII bytes) and "stream" (optional: true or
// false). A body that is not a well-formed form, has more than MaxFormParts parts, or repeats
// a field the gateway reads is refused, so the gateway never routes on one value while the
// engine reads another.
func ParseMultipart(kind Kind, contentType string, body []byte) (Request, error) {
	if !kind.Multipart() {
		return Request{}, &Error{Msg: "unknown request kind " + kind.String()}
	}
	boundary, err := FormBoundary(contentType)
	if err != nil {
		return Request{}, err
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	var r Request
	var haveModel, haveStream bool
	for n := 0; ; n++ {
		part, err := mr.NextRawPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Request{}, &Error{Msg: "invalid multipart body: " + err.Error()}
		}
		if n >= MaxFormParts {
			return Request{}, &Error{Msg: "the form has more than 64 parts"}
		}
		switch part.FormName() {
		case "model":
			if haveModel {
				return Request{}, duplicateKey([]byte("model"))
			}
			haveModel = true
			v, err := formValue(part, "model")
			if err != nil {
				return Request{}, err
			}
			if !ValidName(v) {
				return Request{}, mustBe("model", "1 to 256 printable ASCII characters")
			}
			r.Model = v
		case "stream":
			if haveStream {
				return Request{}, duplicateKey([]byte("stream"))
			}
			haveStream = true
			v, err := formValue(part, "stream")
			if err != nil {
				return Request{}, err
			}
			switch v {
			case "true", "True", "1":
				r.Stream = true
			case "false", "False", "0", "":
			default:
				return Request{}, mustBe("stream", "true or false")
			}
		default:
			if _, err := io.Copy(io.Discard, part); err != nil {
				return Request{}, &Error{Msg: "invalid multipart body: " + err.Error()}
			}
		}
	}
	if !haveModel {
		return Request{}, required("model")
	}
	r.PrefixKey = []byte{}
	r.Cost = Cost{Prompts: 1, Choices: 1}
	return r, nil
}

// formValue reads a field the gateway routes on, at most maxFormFieldBytes.
func formValue(part *multipart.Part, name string) (string, error) {
	b, err := io.ReadAll(io.LimitReader(part, maxFormFieldBytes+1))
	if err != nil {
		return "", &Error{Msg: "invalid multipart body: " + err.Error()}
	}
	if len(b) > maxFormFieldBytes {
		return "", mustBe(name, "at most 256 bytes")
	}
	return string(b), nil
}

// RewriteMultipartModel returns an audio form (kind's, of contentType) with its model field's
// value replaced by model, every other byte kept, in a new slice. The result is read back as
// the engine will read it (ParseMultipart): a form in which the rewrite did not land on the
// one model field the standard reader sees is refused rather than relayed.
func RewriteMultipartModel(kind Kind, contentType string, body []byte, model string) ([]byte, error) {
	boundary, err := FormBoundary(contentType)
	if err != nil {
		return nil, err
	}
	out, err := RewriteFormField(body, boundary, "model", model)
	if err != nil {
		return nil, err
	}
	if got, err := ParseMultipart(kind, contentType, out); err != nil || got.Model != model {
		return nil, &Error{Param: "model", Msg: "the form's model field could not be replaced"}
	}
	return out, nil
}

// RewriteFormField returns body with the value of its form field name replaced by value,
// every other byte kept, in a new slice. body is a form ParseMultipart accepted (one such
// field); an error means the field was not found.
func RewriteFormField(body []byte, boundary, name, value string) ([]byte, error) {
	delim := []byte("\r\n--" + boundary)
	// The first delimiter may open the body without the CRLF before it.
	pos := 0
	if bytes.HasPrefix(body, delim[2:]) {
		pos = len(delim) - 2
	} else if i := nextDelimiter(body, 0, delim); i >= 0 {
		pos = i + len(delim)
	} else {
		return nil, errNoField
	}
	for {
		if bytes.HasPrefix(body[pos:], []byte("--")) {
			return nil, errNoField // the closing delimiter
		}
		eol := bytes.Index(body[pos:], []byte("\r\n"))
		if eol < 0 {
			return nil, errNoField
		}
		hdrStart := pos + eol + 2
		hdrEnd := bytes.Index(body[hdrStart:], []byte("\r\n\r\n"))
		var contentStart int
		var hdr textproto.MIMEHeader
		if bytes.HasPrefix(body[hdrStart:], []byte("\r\n")) {
			contentStart = hdrStart + 2 // a part without headers
		} else {
			if hdrEnd < 0 {
				return nil, errNoField
			}
			contentStart = hdrStart + hdrEnd + 4
			var err error
			tr := textproto.NewReader(bufioReader(body[hdrStart:contentStart]))
			if hdr, err = tr.ReadMIMEHeader(); err != nil && !errors.Is(err, io.EOF) {
				return nil, errNoField
			}
		}
		contentEnd := nextDelimiter(body, contentStart, delim)
		if contentEnd < 0 {
			return nil, errNoField
		}
		if formName(hdr) == name {
			out := make([]byte, 0, len(body)-(contentEnd-contentStart)+len(value))
			out = append(out, body[:contentStart]...)
			out = append(out, value...)
			return append(out, body[contentEnd:]...), nil
		}
		pos = contentEnd + len(delim)
	}
}

var errNoField = &Error{Msg: "the form field to rewrite was not found"}

// nextDelimiter is the index of the first delimiter (CRLF "--" boundary) in body at or after
// from that is one as mime/multipart reads it: followed by "--" (the close) or by optional
// spaces and tabs and CRLF. The same bytes inside a part's content followed by anything else
// are content. -1 when there is none.
func nextDelimiter(body []byte, from int, delim []byte) int {
	for from <= len(body) {
		i := bytes.Index(body[from:], delim)
		if i < 0 {
			return -1
		}
		at := from + i
		rest := bytes.TrimLeft(body[at+len(delim):], " \t")
		if bytes.HasPrefix(body[at+len(delim):], []byte("--")) || bytes.HasPrefix(rest, []byte("\r\n")) {
			return at
		}
		from = at + 1
	}
	return -1
}

// formName is the name parameter of a part's form-data Content-Disposition ("" if none), as
// multipart.Part.FormName reads it.
func formName(h textproto.MIMEHeader) string {
	d, params, err := mime.ParseMediaType(h.Get("Content-Disposition"))
	if err != nil || d != "form-data" {
		return ""
	}
	return params["name"]
}

// bufioReader reads b through the buffered reader textproto needs.
func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
