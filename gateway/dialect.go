package gateway

import (
	"net/http"
	"strings"

	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/gemini"
	"github.com/imgctx/imgctx/wire/openai"
	"github.com/imgctx/imgctx/wire/responses"
)

// dialect is a drop-in route's wire (its package's wire.Dialect) with what
// the gateway adds: which upstreams serve it, the error shape it answers
// with, and what the URL carries.
type dialect struct {
	*wire.Dialect
	format upstream.Format // the upstreams that serve it
	shape  shape
	// fromPath, when set, reads what the wire puts in the URL rather than
	// the body (Gemini: the model, and whether the answer streams).
	fromPath func(r *http.Request, sp *wire.Spliced)
}

// The drop-in routes' wires: adding one is its wire package and a line here.
var (
	chatDialect      = &dialect{Dialect: openai.Dialect, format: upstream.OpenAI, shape: openaiShape}
	messagesDialect  = &dialect{Dialect: anthropic.Dialect, format: upstream.Anthropic, shape: anthropicShape}
	responsesDialect = &dialect{Dialect: responses.Dialect, format: upstream.OpenAI, shape: openaiShape}
	geminiDialect    = &dialect{Dialect: gemini.Dialect, format: upstream.Gemini, shape: geminiShape, fromPath: geminiCall}
)

// geminiCall reads /v1beta/models/{model}:{method}: the model, and
// whether the method streams.
func geminiCall(r *http.Request, sp *wire.Spliced) {
	model, method, _ := strings.Cut(r.PathValue("call"), ":")
	sp.Model, sp.Stream = model, method == "streamGenerateContent"
}
