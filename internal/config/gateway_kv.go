package config

import (
	"net"
	"strconv"
	"time"

	"github.com/tlgw/tlgw/internal/kvindex"
)

// KVEvents is [gateway.kv_events] (R22): vLLM-format KV-cache events over ZMQ, for the exact
// prefix index of precise_prefix.
type KVEvents struct {
	// Listen is a host:port the gateway binds a ZMQ SUB socket on, for engines that connect
	// to one consumer ("" = none).
	Listen string
	// Connect: subscribe to the endpoint each worker advertises (kv_events_endpoint).
	Connect bool
	// MaxBlocksPerWorker bounds the blocks (and engine hashes) kept per worker, 1 to 1048576.
	MaxBlocksPerWorker int
	// Replay: on a seq gap, ask the worker's replay endpoint (when it advertises one) for the
	// missed batches; otherwise (or when replay fails) the worker's entries are cleared.
	Replay bool
}

// Tokenizer values (R22): how the gateway gets a request's token ids.
const (
	TokenizerEstimate = "estimate" // none: precise_prefix on vLLM events falls back to the approximate index
	TokenizerEngine   = "engine"   // render the request on a worker of its model
)

// TokenizerEndpoint values (R22).
const (
	TokenizerRender   = "render"   // /v1/chat/completions/render or /v1/completions/render, by the request's kind
	TokenizerTokenize = "tokenize" // /tokenize
)

// MaxTokenizerTimeout bounds gateway.tokenizer_timeout: a render slower than this is no help to
// a pick.
const MaxTokenizerTimeout = 10 * time.Second

func defaultKVEvents() KVEvents {
	return KVEvents{Connect: true, MaxBlocksPerWorker: 65536, Replay: true}
}

// fileGatewayKV is the [gateway] keys of R22's KV events and tokenizer.
type fileGatewayKV struct {
	KVEvents          *fileKVEvents `json:"kv_events"`
	Tokenizer         *string       `json:"tokenizer"`
	TokenizerEndpoint *string       `json:"tokenizer_endpoint"`
	TokenizerTimeout  *Duration     `json:"tokenizer_timeout"`
}

type fileKVEvents struct {
	Listen             *string `json:"listen"`
	Connect            *bool   `json:"connect"`
	MaxBlocksPerWorker *int    `json:"max_blocks_per_worker"`
	Replay             *bool   `json:"replay"`
}

func (fk *fileGatewayKV) apply(g *Gateway, base path, ps *problems) {
	if fe := fk.KVEvents; fe != nil {
		at := base.with(key("kv_events"))
		setIf(&g.KVEvents.Listen, fe.Listen)
		setIf(&g.KVEvents.Connect, fe.Connect)
		setIf(&g.KVEvents.MaxBlocksPerWorker, fe.MaxBlocksPerWorker)
		setIf(&g.KVEvents.Replay, fe.Replay)
		if l := g.KVEvents.Listen; l != "" {
			host, port, err := net.SplitHostPort(l)
			n, perr := strconv.ParseUint(port, 10, 16)
			if err != nil || perr != nil || host == "" {
				ps.add(at.with(key("listen")), "%q is not host:port", l)
			} else if n == 0 {
				ps.add(at.with(key("listen")), "needs a fixed port: engines connect to it")
			}
		}
		if n := g.KVEvents.MaxBlocksPerWorker; n < 1 || n > kvindex.MaxBlocksPerWorker {
			ps.add(at.with(key("max_blocks_per_worker")), "must be 1 to %d", kvindex.MaxBlocksPerWorker)
		}
	}
	setIf(&g.Tokenizer, fk.Tokenizer)
	setIf(&g.TokenizerEndpoint, fk.TokenizerEndpoint)
	if fk.TokenizerTimeout != nil {
		g.TokenizerTimeout = time.Duration(*fk.TokenizerTimeout)
	}
	switch g.Tokenizer {
	case TokenizerEstimate, TokenizerEngine:
	default:
		ps.add(base.with(key("tokenizer")), "%q is not engine or estimate", g.Tokenizer)
	}
	switch g.TokenizerEndpoint {
	case TokenizerRender, TokenizerTokenize:
	default:
		ps.add(base.with(key("tokenizer_endpoint")), "%q is not render or tokenize", g.TokenizerEndpoint)
	}
	if t := g.TokenizerTimeout; t < time.Millisecond || t > MaxTokenizerTimeout {
		ps.add(base.with(key("tokenizer_timeout")), "must be 1ms to %s", MaxTokenizerTimeout)
	}
}
