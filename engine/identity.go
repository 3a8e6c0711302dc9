package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/imgctx/imgctx/wire"
)

// fingerprintBytes bounds what of each opening message names a
// conversation: enough to tell two apart, cheap on a pasted screenshot.
const fingerprintBytes = 16 << 10

// ConversationKey names a proxied conversation without configuration. Its
// identity is the first of: X-Imgctx-Session; the agent's own id
// (X-Claude-Code-Session-Id, codex's Session-Id, prompt_cache_key, the
// session part of Anthropic metadata.user_id); nothing. A fingerprint of
// the conversation's opening messages (up to the first user message) is
// always part of the key, so one static header configured for every call
// of an agent never merges two conversations. The key is a hash: a client
// value of any size costs 64 bytes of state.
func ConversationKey(tenant, wireName string, h http.Header, sp *wire.Spliced) string {
	d := sha256.New()
	d.Write([]byte(tenant + "\x00" + wireName + "\x00"))
	d.Write([]byte(conversationID(h, sp)))
	d.Write([]byte{0})
	for i, m := range sp.Marks {
		raw := sp.Body[m.Start:m.End]
		d.Write(raw[:min(len(raw), fingerprintBytes)])
		d.Write([]byte{0})
		if i < len(sp.Messages) && sp.Messages[i].Role == "user" {
			break
		}
	}
	return hex.EncodeToString(d.Sum(nil))
}

func conversationID(h http.Header, sp *wire.Spliced) string {
	for _, k := range conversationHeaders {
		if v := h.Get(k); v != "" {
			return k + ":" + v
		}
	}
	if v := topString(sp, "prompt_cache_key"); v != "" {
		return "prompt_cache_key:" + v
	}
	if span, ok := sp.Top["metadata"]; ok {
		var id string
		if wire.DecodeMember(sp.Body[span.Start:span.End], "user_id", &id) {
			// Claude Code: user_<hash>_account_<uuid>_session_<uuid>, or a
			// JSON object with a session_id.
			if _, session, ok := strings.Cut(id, "_session_"); ok {
				return "user_id session:" + session
			}
			if _, rest, ok := strings.Cut(id, `"session_id":"`); ok {
				session, _, _ := strings.Cut(rest, `"`)
				return "user_id session:" + session
			}
		}
	}
	return ""
}

// topString is a top-level string member of the body, "" when absent.
func topString(sp *wire.Spliced, name string) string {
	var v string
	if span, ok := sp.Top[name]; ok {
		json.Unmarshal(sp.Body[span.Start:span.End], &v)
	}
	return v
}
