package vllmkv

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Topic is a parsed KV-event topic, "kv@HOST:PORT@MODEL": the HTTP serving address of the
// engine that publishes (so the topic names the worker) and its model.
type Topic struct {
	Addr  string // host:port, as in the topic (an IPv6 host in brackets)
	Model string
}

// ErrTopic: a topic that is not kv@HOST:PORT@MODEL.
var ErrTopic = errors.New("vllmkv: a topic is kv@HOST:PORT@MODEL")

// ParseTopic parses a topic. The host is a name or an address (IPv6 in brackets), the port
// 1–65535, the model non-empty, printable ASCII without spaces; the whole at most MaxString
// bytes. A topic with more '@' than the three parts is refused (a model name never holds one).
func ParseTopic(s string) (Topic, error) {
	if len(s) > MaxString {
		return Topic{}, fmt.Errorf("%w: %d bytes, more than %d", ErrTopic, len(s), MaxString)
	}
	rest, ok := strings.CutPrefix(s, "kv@")
	if !ok {
		return Topic{}, fmt.Errorf("%w: no kv@ prefix", ErrTopic)
	}
	addr, model, ok := strings.Cut(rest, "@")
	if !ok || model == "" || strings.Contains(model, "@") {
		return Topic{}, fmt.Errorf("%w: want exactly one model after the address", ErrTopic)
	}
	if !printable(model) {
		return Topic{}, fmt.Errorf("%w: the model holds a byte that is not printable ASCII", ErrTopic)
	}
	if err := checkHostPort(addr); err != nil {
		return Topic{}, fmt.Errorf("%w: %v", ErrTopic, err)
	}
	return Topic{Addr: addr, Model: model}, nil
}

// FormatTopic is ParseTopic's inverse.
func FormatTopic(addr, model string) string { return "kv@" + addr + "@" + model }

// Endpoint is a worker's advertised KV-event endpoint (WorkerStatus.kv_events_endpoint, or
// kv_events_endpoint in the static worker table): the ZMQ PUB address it binds and, optionally,
// its replay ROUTER's address.
//
//	tcp://HOST:PORT                          events only
//	tcp://HOST:PORT?replay=tcp://HOST:PORT   events and a replay endpoint
type Endpoint struct {
	Events string // tcp://host:port
	Replay string // tcp://host:port, or "" when none
}

// String formats e as ParseEndpoint reads it.
func (e Endpoint) String() string {
	if e.Replay == "" {
		return e.Events
	}
	return e.Events + "?replay=" + e.Replay
}

// ParseEndpoint parses an advertised endpoint (at most MaxString bytes). "" is no endpoint and
// no error.
func ParseEndpoint(s string) (Endpoint, error) {
	if s == "" {
		return Endpoint{}, nil
	}
	if len(s) > MaxString {
		return Endpoint{}, fmt.Errorf("kv_events_endpoint: %d bytes, more than %d", len(s), MaxString)
	}
	ev, q, hasQ := strings.Cut(s, "?")
	var e Endpoint
	var err error
	if e.Events, err = parseTCP(ev); err != nil {
		return Endpoint{}, fmt.Errorf("kv_events_endpoint: %w", err)
	}
	if hasQ {
		r, ok := strings.CutPrefix(q, "replay=")
		if !ok {
			return Endpoint{}, errors.New("kv_events_endpoint: the only query is replay=tcp://HOST:PORT")
		}
		if e.Replay, err = parseTCP(r); err != nil {
			return Endpoint{}, fmt.Errorf("kv_events_endpoint replay: %w", err)
		}
	}
	return e, nil
}

// parseTCP checks tcp://HOST:PORT and returns it as given.
func parseTCP(s string) (string, error) {
	hp, ok := strings.CutPrefix(s, "tcp://")
	if !ok {
		return "", fmt.Errorf("%q is not tcp://HOST:PORT", s)
	}
	if err := checkHostPort(hp); err != nil {
		return "", err
	}
	return s, nil
}

// checkHostPort checks HOST:PORT: a non-empty host of printable ASCII without '/', '@', '?' or
// spaces, a port 1–65535 in decimal.
func checkHostPort(hp string) error {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return fmt.Errorf("address %q: %v", hp, err)
	}
	if host == "" || !printable(host) || strings.ContainsAny(host, "/@?#") {
		return fmt.Errorf("address %q: a bad host", hp)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != port {
		return fmt.Errorf("address %q: the port is not 1–65535", hp)
	}
	return nil
}

// printable reports whether s is non-empty printable ASCII without spaces.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return s != ""
}
