package sampler_test

import (
	"fmt"
	"strings"

	"github.com/tlgw/tlgw/sim/sampler"
)

// A prefill worker samples the first token and reports it with Draws(); a
// decode worker resumes from there and produces the same completion a
// unified engine would.
func ExampleResume() {
	prompt := sampler.Tokenize(sampler.RenderChat([]sampler.Message{{Role: "user", Content: "Tell me about the sea."}}))
	p := sampler.DefaultParams()
	p.Seed = 42
	p.MaxTokens = 8

	// Unified: one generator, start to finish.
	var unified strings.Builder
	g := sampler.NewGenerator("smol", prompt, p)
	for tok, _, ok := g.Next(); ok; tok, _, ok = g.Next() {
		unified.WriteString(tok.Text)
	}

	// Disaggregated: prefill returns the first token and the draw count ...
	pre := sampler.NewGenerator("smol", prompt, p)
	first, _, _ := pre.Next()
	draws := pre.Draws()

	// ... and decode continues the same stream.
	split := first.Text
	dec := sampler.Resume("smol", prompt, p, []uint32{first.ID}, draws)
	tok, finish, ok := dec.Next()
	for ; ok; tok, finish, ok = dec.Next() {
		split += tok.Text
	}
	fmt.Println(draws, split == unified.String(), finish)
	// Output: 2 true length
}
