package wire_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/gemini"
	"github.com/imgctx/imgctx/wire/openai"
	"github.com/imgctx/imgctx/wire/responses"
)

// Each wire's refusal of a prompt past the window (proxy.client_window),
// in its provider's shape, reads back as one: the words its clients look
// for, the kind imgctx's own classifier gives.
func TestTooLongReadsBackAsTooLong(t *testing.T) {
	for _, d := range []*wire.Dialect{anthropic.Dialect, openai.Dialect, responses.Dialect, gemini.Dialect} {
		typ, msg := d.TooLong(201_234, 200_000)
		body, err := json.Marshal(d.ErrorBody(400, typ, msg))
		if err != nil {
			t.Fatal(err)
		}
		e := d.DecodeError(400, http.Header{}, body)
		if e.Kind != wire.PromptTooLong || !strings.Contains(string(body), "201234") || !strings.Contains(string(body), "200000") {
			t.Errorf("%s: %s reads back as %s", d.Name, body, e.Kind)
		}
	}
}
