package engine

import (
	"net/http"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/openai"
)

// The conversation key: the first identity found, always with the opening
// messages, hashed.
func TestConversationKey(t *testing.T) {
	key := func(format upstream.Format, body string, h ...string) string {
		t.Helper()
		scan := openai.Scan
		if format == upstream.Anthropic {
			scan = anthropic.Scan
		}
		sp, err := scan([]byte(body), wire.ScanOptions{})
		if err != nil {
			t.Fatal(err)
		}
		hdr := http.Header{}
		for i := 0; i+1 < len(h); i += 2 {
			hdr.Set(h[i], h[i+1])
		}
		return ConversationKey("acme", string(format), hdr, sp)
	}
	const a = `{"model":"m","messages":[{"role":"system","content":"You code."},{"role":"user","content":"Fix the bug."}]}`
	const b = `{"model":"m","messages":[{"role":"system","content":"You code."},{"role":"user","content":"Write the docs."}]}`
	const aLater = `{"model":"m","messages":[{"role":"system","content":"You code."},{"role":"user","content":"Fix the bug."},{"role":"assistant","content":"Done."},{"role":"user","content":"Thanks."}]}`
	distinct := map[string]string{
		"no id":                  key(upstream.OpenAI, a),
		"no id, other opening":   key(upstream.OpenAI, b),
		"X-Imgctx-Session":       key(upstream.OpenAI, a, "X-Imgctx-Session", "s1"),
		"X-Imgctx-Session other": key(upstream.OpenAI, a, "X-Imgctx-Session", "s2"),
		"static header, b":       key(upstream.OpenAI, b, "X-Imgctx-Session", "s1"),
		"claude code":            key(upstream.OpenAI, a, "X-Claude-Code-Session-Id", "c1"),
		"codex":                  key(upstream.OpenAI, a, "Session-Id", "c1"),
		"prompt_cache_key":       key(upstream.OpenAI, `{"model":"m","prompt_cache_key":"p1",`+a[len(`{"model":"m",`):]),
		"anthropic wire":         key(upstream.Anthropic, `{"model":"m","messages":[{"role":"user","content":"Fix the bug."}]}`),
		"metadata session":       key(upstream.Anthropic, `{"model":"m","metadata":{"user_id":"user_ab_account_cd_session_1234"},"messages":[{"role":"user","content":"Fix the bug."}]}`),
		"metadata json":          key(upstream.Anthropic, `{"model":"m","metadata":{"user_id":"{\"device_id\":\"d\",\"session_id\":\"5678\"}"},"messages":[{"role":"user","content":"Fix the bug."}]}`),
	}
	seen := map[string]string{}
	for name, k := range distinct {
		if len(k) != 64 {
			t.Errorf("%s: key %q is not 64 hex digits", name, k)
		}
		if other, ok := seen[k]; ok {
			t.Errorf("%s and %s share a key", name, other)
		}
		seen[k] = name
	}
	if key(upstream.OpenAI, aLater) != distinct["no id"] {
		t.Error("the conversation's key changed as it grew")
	}
	if key(upstream.OpenAI, a, "X-Imgctx-Session", "s1", "X-Claude-Code-Session-Id", "c1") != distinct["X-Imgctx-Session"] {
		t.Error("X-Imgctx-Session does not come first")
	}
	// A header of any size is a key of the same size.
	if k := key(upstream.OpenAI, a, "X-Imgctx-Session", strings.Repeat("x", 1<<20)); len(k) != 64 {
		t.Errorf("a 1 MB id gave a key of %d bytes", len(k))
	}
	// The same session part of metadata.user_id in either form is one conversation.
	if distinct["metadata session"] == key(upstream.Anthropic, `{"model":"m","metadata":{"user_id":"user_zz_account_yy_session_1234"},"messages":[{"role":"user","content":"Fix the bug."}]}`) {
		return
	}
	t.Error("the session part of metadata.user_id is not what names the conversation")
}
