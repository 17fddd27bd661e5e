package enginetok

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		e    Endpoint
		body string
		want []uint32
	}{
		{ChatRender, `{"token_ids":[1,2,3],"request_id":"x"}`, []uint32{1, 2, 3}},
		{CompletionsRender, ` [{"token_ids":[7]},{"token_ids":[8,9]}] `, []uint32{7}},
		{CompletionsRender, `{"token_ids":[4294967295,0]}`, []uint32{4294967295, 0}},
		{Tokenize, `{"count":2,"max_model_len":8192,"tokens":[5,6]}`, []uint32{5, 6}},
		{Tokenize, `{"tokens":[]}`, []uint32{}},
	} {
		got, err := Parse(c.e, []byte(c.body))
		if err != nil || !slices.Equal(got, c.want) {
			t.Errorf("Parse(%d, %s) = %v, %v; want %v", c.e, c.body, got, err, c.want)
		}
	}
	for _, c := range []struct {
		e    Endpoint
		body string
	}{
		{ChatRender, `{}`}, {ChatRender, `{"token_ids":null}`}, {ChatRender, `{"token_ids":[-1]}`},
		{ChatRender, `{"token_ids":[4294967296]}`}, {ChatRender, `{"token_ids":[1.5]}`}, {ChatRender, `{"token_ids":["1"]}`},
		{ChatRender, `{"token_ids":[1]} {}`}, {ChatRender, `[`}, {CompletionsRender, `[]`}, {CompletionsRender, `[{}]`},
		{Tokenize, `{"token_ids":[1]}`}, {Tokenize, ``},
		{ChatRender, `{"token_ids":[` + strings.Repeat("1,", MaxTokens) + `1]}`},
		{ChatRender, strings.Repeat(" ", MaxAnswerBytes+1)},
	} {
		if got, err := Parse(c.e, []byte(c.body)); !errors.Is(err, ErrAnswer) {
			t.Errorf("Parse(%d, %.60s) = %v, %v; want ErrAnswer", c.e, c.body, got, err)
		}
	}
	// Exactly MaxTokens ids parse.
	at := `{"token_ids":[` + strings.Repeat("1,", MaxTokens-1) + `1]}`
	if got, err := Parse(ChatRender, []byte(at)); err != nil || len(got) != MaxTokens {
		t.Errorf("MaxTokens ids: %d, %v", len(got), err)
	}
	if ChatRender.Path() != "/v1/chat/completions/render" || CompletionsRender.Path() != "/v1/completions/render" || Tokenize.Path() != "/tokenize" {
		t.Error("paths")
	}
}

func FuzzParse(f *testing.F) {
	f.Add(uint8(0), []byte(`{"token_ids":[1,2]}`))
	f.Add(uint8(1), []byte(`[{"token_ids":[1]}]`))
	f.Add(uint8(2), []byte(`{"tokens":[3]}`))
	f.Fuzz(func(t *testing.T, e uint8, body []byte) {
		ids, err := Parse(Endpoint(e%3), body)
		if err != nil && !errors.Is(err, ErrAnswer) {
			t.Fatalf("an error that is not ErrAnswer: %v", err)
		}
		if err == nil && len(ids) > MaxTokens {
			t.Fatal("over MaxTokens")
		}
	})
}

// TestParseAtTheByteBound: an answer of exactly MaxAnswerBytes is read; one byte more is not.
func TestParseAtTheByteBound(t *testing.T) {
	ans := `{"tokens":[7]}`
	at := ans + strings.Repeat(" ", MaxAnswerBytes-len(ans))
	if ids, err := Parse(Tokenize, []byte(at)); err != nil || len(ids) != 1 || ids[0] != 7 {
		t.Fatalf("at the bound: %v %v", ids, err)
	}
	if _, err := Parse(Tokenize, []byte(at+" ")); err == nil {
		t.Fatal("one byte over the bound was read")
	}
}
