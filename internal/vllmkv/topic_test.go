package vllmkv

import (
	"errors"
	"strings"
	"testing"
)

func TestParseTopic(t *testing.T) {
	good := []struct{ in, addr, model string }{
		{"kv@127.0.0.1:8000@base-model", "127.0.0.1:8000", "base-model"},
		{"kv@[::1]:1@m", "[::1]:1", "m"},
		{"kv@engine-0.svc:65535@org/model:v1", "engine-0.svc:65535", "org/model:v1"},
	}
	for _, c := range good {
		tp, err := ParseTopic(c.in)
		if err != nil || tp.Addr != c.addr || tp.Model != c.model {
			t.Errorf("ParseTopic(%q) = %+v, %v; want %s %s", c.in, tp, err, c.addr, c.model)
		}
		if FormatTopic(tp.Addr, tp.Model) != c.in {
			t.Errorf("FormatTopic(%+v) = %q", tp, FormatTopic(tp.Addr, tp.Model))
		}
	}
	bad := []string{
		"", "kv", "kv@", "kv@@m", "kv@127.0.0.1:8000", "kv@127.0.0.1:8000@", "kv@127.0.0.1:8000@m@x",
		"kv@127.0.0.1@m", "kv@127.0.0.1:0@m", "kv@127.0.0.1:65536@m", "kv@127.0.0.1:080@m",
		"kv@127.0.0.1:+80@m", "kv@:80@m", "kv@a b:80@m", "kv@h:80@m m", "kv@h:80@m\x00", "kv@h:80@é",
		"KV@h:80@m", "xkv@h:80@m", "kv@h/x:80@m", "kv@h:80:90@m",
		"kv@h:80@" + strings.Repeat("m", MaxString),
	}
	for _, s := range bad {
		if tp, err := ParseTopic(s); err == nil || !errors.Is(err, ErrTopic) {
			t.Errorf("ParseTopic(%q) = %+v, %v; want ErrTopic", s, tp, err)
		}
	}
	// The length bound: exactly MaxString bytes parses, one more does not.
	at := "kv@h:80@" + strings.Repeat("m", MaxString-len("kv@h:80@"))
	if _, err := ParseTopic(at); err != nil {
		t.Errorf("a topic of MaxString bytes: %v", err)
	}
	if _, err := ParseTopic(at + "m"); err == nil {
		t.Error("a topic of MaxString+1 bytes parsed")
	}
}

func TestParseEndpoint(t *testing.T) {
	good := []struct{ in, ev, replay string }{
		{"", "", ""},
		{"tcp://127.0.0.1:5557", "tcp://127.0.0.1:5557", ""},
		{"tcp://h:5557?replay=tcp://h:5558", "tcp://h:5557", "tcp://h:5558"},
		{"tcp://[::1]:5557?replay=tcp://[::1]:5558", "tcp://[::1]:5557", "tcp://[::1]:5558"},
	}
	for _, c := range good {
		e, err := ParseEndpoint(c.in)
		if err != nil || e.Events != c.ev || e.Replay != c.replay {
			t.Errorf("ParseEndpoint(%q) = %+v, %v", c.in, e, err)
		}
		if e.String() != c.in {
			t.Errorf("String() = %q, want %q", e.String(), c.in)
		}
	}
	bad := []string{
		"127.0.0.1:5557", "tcp://", "tcp://h", "tcp://h:0", "udp://h:1", "ipc:///tmp/x", "tcp://*:5557x",
		"tcp://h:1?", "tcp://h:1?replay=", "tcp://h:1?replay=h:2", "tcp://h:1?other=tcp://h:2",
		"tcp://h:1?replay=tcp://h:2?replay=tcp://h:3", "tcp://h@x:1", "tcp://h:1/path",
		"tcp://" + strings.Repeat("h", MaxString) + ":1",
	}
	for _, s := range bad {
		if e, err := ParseEndpoint(s); err == nil {
			t.Errorf("ParseEndpoint(%q) = %+v, nil; want an error", s, e)
		}
	}
}

// FuzzParseTopic: any string either parses into a topic that formats back to itself, or is
// refused with ErrTopic; the same for endpoints.
func FuzzParseTopic(f *testing.F) {
	for _, s := range []string{"kv@127.0.0.1:8000@m", "kv@[::1]:1@m", "kv@h:80@m@x", "tcp://h:1?replay=tcp://h:2", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if tp, err := ParseTopic(s); err == nil {
			if FormatTopic(tp.Addr, tp.Model) != s {
				t.Fatalf("%q parsed to %+v, which formats to another topic", s, tp)
			}
		} else if !errors.Is(err, ErrTopic) {
			t.Fatalf("%q: an error that is not ErrTopic: %v", s, err)
		}
		if e, err := ParseEndpoint(s); err == nil && e.String() != s {
			t.Fatalf("%q parsed to %+v, which formats to another endpoint", s, e)
		}
	})
}
