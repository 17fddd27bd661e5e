package config

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Problem is one thing wrong with a configuration or a route table.
type Problem struct {
	// Path names the offending key in TOML terms, e.g.
	// "gateway.routes[0].backends[1].weight" (for ValidateRoutes, relative to
	// the route list: "routes[2].cascade[0].accept_if"). It is empty for a
	// problem tied to no key, such as a TOML syntax error.
	Path string
	// Message says what is wrong, e.g. "must be >= 0" or "unknown key".
	Message string
}

// String returns "path: message", or the message alone when Path is empty.
func (p Problem) String() string {
	if p.Path == "" {
		return p.Message
	}
	return p.Path + ": " + p.Message
}

// Error lists every problem found in a configuration (from Parse and Load)
// or in a route table (from ValidateRoutes). Its message has one line per
// problem; configuration errors prefix each line with "config: ".
type Error struct {
	Problems []Problem

	prefix string
}

func (e *Error) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.prefix)
		b.WriteString(p.String())
	}
	return b.String()
}

// problems collects Problems with their locations, so they can be reported
// in a stable order with duplicates removed.
type problems struct {
	list []located
}

type located struct {
	loc []pathElem
	Problem
}

// pathElem is one step of a location: a key, or an index into an array.
type pathElem struct {
	key   string
	index int
	isIdx bool
}

func key(k string) pathElem { return pathElem{key: k} }
func index(i int) pathElem  { return pathElem{index: i, isIdx: true} }

type path []pathElem

// with returns a new path extended by elems; the receiver is not modified.
func (p path) with(elems ...pathElem) path {
	return append(slices.Clip(p), elems...)
}

func (p path) String() string {
	var b strings.Builder
	for i, e := range p {
		if e.isIdx {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(e.index))
			b.WriteByte(']')
			continue
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(tomlKey(e.key))
	}
	return b.String()
}

// tomlKey writes a key as TOML does: bare when it can be, quoted otherwise.
func tomlKey(k string) string {
	if k == "" {
		return `""`
	}
	for _, r := range k {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return strconv.Quote(k)
		}
	}
	return k
}

func (ps *problems) add(p path, format string, args ...any) {
	ps.list = append(ps.list, located{loc: slices.Clone(p), Problem: Problem{Path: p.String(), Message: fmt.Sprintf(format, args...)}})
}

func (ps *problems) empty() bool { return len(ps.list) == 0 }

// sorted returns the problems ordered by location (keys compared as
// strings, array indexes as numbers), without duplicates.
func (ps *problems) sorted() []Problem {
	list := slices.Clone(ps.list)
	slices.SortStableFunc(list, func(a, b located) int {
		for i := 0; i < len(a.loc) && i < len(b.loc); i++ {
			x, y := a.loc[i], b.loc[i]
			if x.isIdx && y.isIdx {
				if c := cmp.Compare(x.index, y.index); c != 0 {
					return c
				}
				continue
			}
			if c := cmp.Compare(x.String(), y.String()); c != 0 {
				return c
			}
		}
		if c := cmp.Compare(len(a.loc), len(b.loc)); c != 0 {
			return c
		}
		return cmp.Compare(a.Message, b.Message)
	})
	out := make([]Problem, 0, len(list))
	for _, l := range list {
		if len(out) > 0 && out[len(out)-1] == l.Problem {
			continue
		}
		out = append(out, l.Problem)
	}
	return out
}

func (e pathElem) String() string {
	if e.isIdx {
		return "[" + strconv.Itoa(e.index) + "]"
	}
	return e.key
}
