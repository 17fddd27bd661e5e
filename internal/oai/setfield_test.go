package oai

import (
	"encoding/json"
	"testing"
)

func TestSetField(t *testing.T) {
	for _, c := range []struct{ in, key, val, want string }{
		{`{"model":"a","logprobs":null}`, "logprobs", `1`, `{"model":"a","logprobs":1}`},
		{`{"model":"a"}`, "logprobs", `true`, `{"logprobs":true,"model":"a"}`},
		{` { } `, "seed", `42`, ` {"seed":42 } `},
		{"{\n  \"seed\": 1, \"x\": {\"seed\": 2}\n}", "seed", `7`, "{\n  \"seed\": 7, \"x\": {\"seed\": 2}\n}"},
		{`{"se\u0065d":1,"seed":2}`, "seed", `3`, `{"se\u0065d":3,"seed":3}`},
	} {
		got, err := SetField([]byte(c.in), c.key, []byte(c.val))
		if err != nil || string(got) != c.want {
			t.Errorf("SetField(%s, %s, %s) = %s, %v; want %s", c.in, c.key, c.val, got, err, c.want)
		}
		if !json.Valid(got) {
			t.Errorf("invalid JSON %s", got)
		}
	}
	for _, bad := range []string{`[1]`, `{"a":`, ``, `{"a":1}x`} {
		if _, err := SetField([]byte(bad), "k", []byte(`1`)); err == nil {
			t.Errorf("SetField(%q) accepted", bad)
		}
	}
}
