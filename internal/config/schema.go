package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/tlgw/tlgw/contracts"
)

// schemaURL is the $id of contracts/runtime.schema.json.
const schemaURL = "https://github.com/tlgw/tlgw/contracts/runtime.schema.json"

// runtimeSchema compiles contracts.RuntimeSchema once.
var runtimeSchema = sync.OnceValues(func() (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(contracts.RuntimeSchema))
	if err != nil {
		return nil, fmt.Errorf("runtime schema: %w", err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseLoader(noLoader{})
	if err := c.AddResource(schemaURL, doc); err != nil {
		return nil, fmt.Errorf("runtime schema: %w", err)
	}
	sch, err := c.Compile(schemaURL)
	if err != nil {
		return nil, fmt.Errorf("runtime schema: %w", err)
	}
	return sch, nil
})

// noLoader refuses to load anything: the runtime schema is self-contained,
// and validation must never touch the file system or the network.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("schema %s is not available", url)
}

// toJSON turns the tree that go-toml decodes into values that JSON can hold.
// TOML dates and times and non-finite floats have no JSON form: they become
// null (which no field of the schema accepts) and placeholder records why,
// keyed by the value's path, so the schema's complaint can be reworded.
func toJSON(v any, p path, placeholder map[string]string) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = toJSON(e, p.with(key(k)), placeholder)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = toJSON(e, p.with(index(i)), placeholder)
		}
		return out
	case string, bool, int64:
		return x
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			placeholder[p.String()] = "must be a finite number"
			return nil
		}
		return x
	default:
		// time.Time and go-toml's LocalDate, LocalTime and LocalDateTime.
		placeholder[p.String()] = "a TOML date or time is not valid here"
		return nil
	}
}

// validateSchema checks doc (as decoded by jsonschema.UnmarshalJSON) against
// the runtime schema and adds one problem per failed constraint.
func validateSchema(doc any, placeholder map[string]string, ps *problems) error {
	sch, err := runtimeSchema()
	if err != nil {
		return err
	}
	err = sch.Validate(doc)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	collect(ve, doc, placeholder, ps)
	return nil
}

// collect walks the validator's error tree and adds a problem for each leaf.
// oneOf, anyOf and not are reported as one problem each: their causes are
// the failures of alternatives, which would only confuse.
func collect(ve *jsonschema.ValidationError, doc any, placeholder map[string]string, ps *problems) {
	switch ve.ErrorKind.(type) {
	case *kind.OneOf, *kind.AnyOf, *kind.Not:
	default:
		if len(ve.Causes) > 0 {
			for _, c := range ve.Causes {
				collect(c, doc, placeholder, ps)
			}
			return
		}
	}
	p, val := locate(doc, ve.InstanceLocation)
	frag := ve.SchemaURL[strings.LastIndexByte(ve.SchemaURL, '#')+1:]

	switch k := ve.ErrorKind.(type) {
	case *kind.Type, *kind.Enum:
		if msg, ok := placeholder[p.String()]; ok {
			ps.add(p, "%s", msg)
			return
		}
	case *kind.AdditionalProperties:
		for _, name := range k.Properties {
			ps.add(p.with(key(name)), "unknown key")
		}
		return
	case *kind.Required:
		msg := "required key is missing"
		if strings.HasPrefix(frag, "/$defs/classifier/allOf/") {
			msg = `required with type = "cold_pool"`
		}
		for _, name := range k.Missing {
			ps.add(p.with(key(name)), "%s", msg)
		}
		return
	case *kind.FalseSchema:
		if strings.HasPrefix(frag, "/$defs/classifier/allOf/") {
			ps.add(p, `only valid with type = "cold_pool"`)
			return
		}
	}

	// Messages for particular places in the schema.
	switch k := ve.ErrorKind.(type) {
	case *kind.Type, *kind.Pattern:
		if frag == "/$defs/duration" {
			ps.add(p, "%s is not a duration", show(val))
			return
		}
		if frag == "/$defs/apiKey/properties/key_env" {
			ps.add(p, "%s is not an environment variable name", show(val))
			return
		}
	case *kind.OneOf:
		if frag == "/$defs/apiKey" {
			if len(k.Subschemas) == 0 {
				ps.add(p, "one of key or key_env is required")
			} else {
				ps.add(p, "key and key_env are mutually exclusive; give one")
			}
			return
		}
	case *kind.Not:
		if frag == "/$defs/route" {
			ps.add(p, "backends and cascade are mutually exclusive; give at most one")
			return
		}
	case *kind.MinItems, *kind.MaxItems:
		if frag == "/$defs/route/properties/targets" {
			ps.add(p, "must have exactly one item")
			return
		}
	}

	// Generic messages.
	switch k := ve.ErrorKind.(type) {
	case *kind.Type:
		want := make([]string, len(k.Want))
		for i, w := range k.Want {
			want[i] = typeName(w)
		}
		ps.add(p, "must be %s, not %s", strings.Join(want, " or "), typeName(k.Got))
	case *kind.Enum:
		want := make([]string, len(k.Want))
		for i, w := range k.Want {
			want[i] = show(w)
		}
		ps.add(p, "%s is not one of %s", show(k.Got), strings.Join(want, ", "))
	case *kind.Minimum:
		ps.add(p, "must be >= %s", ratString(k.Want))
	case *kind.ExclusiveMinimum:
		ps.add(p, "must be > %s", ratString(k.Want))
	case *kind.Maximum:
		ps.add(p, "must be <= %s", ratString(k.Want))
	case *kind.ExclusiveMaximum:
		ps.add(p, "must be < %s", ratString(k.Want))
	case *kind.MinLength:
		if k.Want == 1 {
			ps.add(p, "must not be empty")
		} else {
			ps.add(p, "must be at least %d characters long", k.Want)
		}
	case *kind.MaxLength:
		ps.add(p, "must be at most %d characters long", k.Want)
	case *kind.MinItems:
		if k.Want == 1 {
			ps.add(p, "must not be empty")
		} else {
			ps.add(p, "must have at least %d items", k.Want)
		}
	case *kind.MaxItems:
		ps.add(p, "must have at most %d items", k.Want)
	case *kind.Pattern:
		ps.add(p, "%s does not match %s", show(val), k.Want)
	default:
		ps.add(p, "%s", ve.ErrorKind.LocalizedString(message.NewPrinter(language.English)))
	}
}

// locate turns a JSON instance location into a path (telling array indexes
// from keys by looking at the document) and returns the value found there.
func locate(doc any, tokens []string) (path, any) {
	p := make(path, 0, len(tokens))
	cur := doc
	for _, t := range tokens {
		switch v := cur.(type) {
		case []any:
			i, err := strconv.Atoi(t)
			if err == nil {
				p = append(p, index(i))
				if i >= 0 && i < len(v) {
					cur = v[i]
				} else {
					cur = nil
				}
				continue
			}
			p, cur = append(p, key(t)), nil
		case map[string]any:
			p, cur = append(p, key(t)), v[t]
		default:
			p, cur = append(p, key(t)), nil
		}
	}
	return p, cur
}

// show renders a value as it would be written in TOML.
func show(v any) string {
	switch x := v.(type) {
	case string:
		return strconv.Quote(x)
	case json.Number:
		return x.String()
	case nil:
		return "nothing"
	case map[string]any:
		return "a table"
	case []any:
		return "an array"
	default:
		return fmt.Sprint(x)
	}
}

// typeName names a JSON Schema type in TOML terms, with an article.
func typeName(t string) string {
	switch t {
	case "object":
		return "a table"
	case "array", "integer":
		return "an " + t
	case "null":
		return "nothing"
	default:
		return "a " + t
	}
}

func ratString(r interface{ Float64() (float64, bool) }) string {
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'f', -1, 64)
}
