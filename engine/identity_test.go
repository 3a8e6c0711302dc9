package engine

import (
	"net/http"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
)

// The conversation key: the first identity found, always with the opening
// messages, hashed.
func TestConversationKey(t *testing.T) {
	key := func(format upstream.Format, body string, h ...string) string {
		t.Helper()
		d := upstream.Wires[format]
		sp, err := d.Scan([]byte(body), wire.ScanOptions{})
		if err != nil {
			t.Fatal(err)
		}
		hdr := http.Header{}
		for i := 0; i+1 < len(h); i += 2 {
			hdr.Set(h[i], h[i+1])
		}
		return ConversationKey("acme", d, hdr, sp)
	}
	const a = `{"model":"m","messages":[{"role":"system","content":"You code."},{"role":"user","content":"Fix the bug."}]}`
	const b = `{"model":"m","messages":[{"role":"system","content":"You code."},{"role":"user","content":"Write the docs."}]}`
	const aLater = `{"model":"m","messages":[{"role":"system","content":"You code."},{"role":"user","content":"Fix the bug."},{"role":"assistant","content":"Done."},{"role":"user","content":"Thanks."}]}`
	distinct := map[string]string{
		"no id":                   key(upstream.OpenAI, a),
		"no id, other opening":    key(upstream.OpenAI, b),
		"X-Imgctx-Session":        key(upstream.OpenAI, a, "X-Imgctx-Session", "s1"),
		"X-Imgctx-Session other":  key(upstream.OpenAI, a, "X-Imgctx-Session", "s2"),
		"static header, b":        key(upstream.OpenAI, b, "X-Imgctx-Session", "s1"),
		"claude code":             key(upstream.OpenAI, a, "X-Claude-Code-Session-Id", "c1"),
		"codex":                   key(upstream.OpenAI, a, "Session-Id", "c1"),
		"opencode":                key(upstream.OpenAI, a, "X-Session-Id", "ses_1"),
		"opencode, other session": key(upstream.OpenAI, a, "X-Session-Id", "ses_2"),
		"prompt_cache_key":        key(upstream.OpenAI, `{"model":"m","prompt_cache_key":"p1",`+a[len(`{"model":"m",`):]),
		"anthropic wire":          key(upstream.Anthropic, `{"model":"m","messages":[{"role":"user","content":"Fix the bug."}]}`),
		"metadata session":        key(upstream.Anthropic, `{"model":"m","metadata":{"user_id":"user_ab_account_cd_session_1234"},"messages":[{"role":"user","content":"Fix the bug."}]}`),
		"metadata json":           key(upstream.Anthropic, `{"model":"m","metadata":{"user_id":"{\"device_id\":\"d\",\"session_id\":\"5678\"}"},"messages":[{"role":"user","content":"Fix the bug."}]}`),
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

// Issue "Drop-in that survives agents changing", item 1: what agents change
// between the requests of one conversation without changing what it says
// leaves its key alone; what two conversations say differently still
// parts them behind one static header.
func TestConversationKeySurvivesAgentEdits(t *testing.T) {
	key := func(format upstream.Format, body string) string {
		t.Helper()
		d := upstream.Wires[format]
		sp, err := d.Scan([]byte(body), wire.ScanOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return ConversationKey("acme", d, http.Header{"X-Imgctx-Session": {"static"}}, sp)
	}
	shot := strings.TrimPrefix(screenshot(64, 48, 3), "data:image/png;base64,")
	other := strings.TrimPrefix(screenshot(64, 48, 4), "data:image/png;base64,")
	same := []struct{ name, format, a, b string }{
		// claude-code: cache_control on the first user message's last
		// block in the first request only (it is then the last message).
		{"cache_control in request 1 only", "anthropic",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"Fix the bug.","cache_control":{"type":"ephemeral"}}]}]}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"Fix the bug."}]},{"role":"assistant","content":"On it."},{"role":"user","content":[{"type":"text","text":"And the tests.","cache_control":{"type":"ephemeral"}}]}]}`},
		// qwen-code --continue: a reminder part of message 1 dropped.
		{"reminder dropped on resume", "openai",
			`{"model":"m","messages":[{"role":"system","content":"You code."},{"role":"user","content":[{"type":"text","text":"<system-reminder>Today is Monday.</system-reminder>"},{"type":"text","text":"Fix the bug."}]}]}`,
			`{"model":"m","messages":[{"role":"system","content":"You code."},{"role":"user","content":[{"type":"text","text":"Fix the bug."}]},{"role":"assistant","content":"Done."},{"role":"user","content":"Thanks."}]}`},
		{"string content or one text part, other spacing", "openai",
			`{"model":"m","messages":[{"role":"user","content":"Fix the bug."}]}`,
			`{"model": "m", "messages": [ {"content": [ {"text": "Fix the bug.", "type": "text"} ], "role": "user"} ]}`},
		{"a pasted image, its block marked in request 1 only", "anthropic",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + shot + `"},"cache_control":{"type":"ephemeral"}},{"type":"text","text":"What is this?"}]}]}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + shot + `"}},{"type":"text","text":"What is this?"}]},{"role":"assistant","content":"A chart."}]}`},
	}
	for _, c := range same {
		if key(upstream.Format(c.format), c.a) != key(upstream.Format(c.format), c.b) {
			t.Errorf("%s: one conversation got two keys", c.name)
		}
	}
	apart := []struct{ name, format, a, b string }{
		{"other prompt", "openai",
			`{"model":"m","messages":[{"role":"user","content":"Fix the bug."}]}`,
			`{"model":"m","messages":[{"role":"user","content":"Write the docs."}]}`},
		{"other system prompt", "openai",
			`{"model":"m","messages":[{"role":"system","content":"You code."},{"role":"user","content":"Go."}]}`,
			`{"model":"m","messages":[{"role":"system","content":"You review."},{"role":"user","content":"Go."}]}`},
		{"other pasted image, same words", "anthropic",
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + shot + `"}},{"type":"text","text":"What is this?"}]}]}`,
			`{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + other + `"}},{"type":"text","text":"What is this?"}]}]}`},
	}
	for _, c := range apart {
		if key(upstream.Format(c.format), c.a) == key(upstream.Format(c.format), c.b) {
			t.Errorf("%s: two conversations behind one static header merged", c.name)
		}
	}
}
