package wire_test

import (
	"testing"

	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/gemini"
	"github.com/imgctx/imgctx/wire/openai"
	"github.com/imgctx/imgctx/wire/responses"
)

// Issue "Hardening, third pass", item 1: a member whose name folds onto a
// managed one under Unicode simple folding — as encoding/json, which Go
// upstreams decode with, matches fields — is refused on every wire, raw or
// \u-escaped; a name that folds onto none passes.
func TestUnicodeFoldedKeysAreRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		scan func([]byte, wire.ScanOptions) (*wire.Spliced, error)
		body string
	}{
		{"chat, raw", openai.Scan, `{"model":"m","meſſages":[{"role":"user","content":"hi"}]}`},
		{"chat, escaped", openai.Scan, `{"model":"m","me\u017f\u017fages":[{"role":"user","content":"hi"}]}`},
		{"chat, upper", openai.Scan, `{"model":"m","MESSAGEſ":[]}`},
		{"chat, image_url", openai.Scan, `{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/a.png"},"image_url":{"url":"https://x/b.png"}}]}]}`},
		{"messages, source", anthropic.Scan, `{"model":"m","messages":[{"role":"user","content":[{"type":"image","ſource":{"type":"url","url":"http://169.254.169.254/"}}]}]}`},
		{"messages, raw", anthropic.Scan, `{"model":"m","meſſages":[]}`},
		{"responses, input", responses.Scan, `{"model":"m","inpu\u0074":"a","input":"b"}`},
		{"gemini, contents", gemini.Scan, `{"contentſ":[]}`},
		{"gemini, parts", gemini.Scan, `{"contents":[{"role":"user","partſ":[]}]}`},
		{"gemini, functionResponse", gemini.Scan, `{"contents":[{"role":"user","parts":[{"functionReſponse":{}}]}]}`},
	} {
		if _, err := c.scan([]byte(c.body), wire.ScanOptions{}); err == nil {
			t.Errorf("%s: %s was accepted", c.name, c.body)
		}
	}
	if _, err := openai.Scan([]byte(`{"model":"m","métadata":{},"messages":[{"role":"user","content":"hi"}]}`), wire.ScanOptions{}); err != nil {
		t.Errorf("a name that folds onto no managed one: %v", err)
	}
}
