package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
)

// fingerprintBytes bounds what of an opening message that cannot be read
// as text, or of an image's data, names a conversation: enough to tell two
// apart, cheap on a pasted screenshot.
const fingerprintBytes = 16 << 10

// ConversationKey names a proxied conversation without configuration. Its
// identity is the first of: X-Imgctx-Session; the agent's own id
// (X-Claude-Code-Session-Id, codex's Session-Id, opencode's X-Session-Id,
// prompt_cache_key, the session part of Anthropic metadata.user_id);
// nothing. A fingerprint of the conversation's opening (fingerprint) is
// always part of the key, so one static header configured for every call
// of an agent never merges two conversations. The key is a hash: a client
// value of any size costs 64 bytes of state.
func ConversationKey(tenant string, d *wire.Dialect, h http.Header, sp *wire.Spliced) string {
	key, _ := conversationKey(tenant, d, conversationID(h, sp), sp)
	return key
}

// conversationKey is ConversationKey for an identity found already; it also
// returns how many opening messages the fingerprint read.
func conversationKey(tenant string, d *wire.Dialect, id string, sp *wire.Spliced) (string, int) {
	sum := sha256.New()
	sum.Write([]byte(tenant + "\x00" + d.Name + "\x00"))
	sum.Write([]byte(id))
	sum.Write([]byte{0})
	n := fingerprint(sum, d, sp)
	return hex.EncodeToString(sum.Sum(nil)), n
}

// fingerprint writes what names a conversation's opening: each message up
// to the first user message, as its role, the text it says and the start
// of each image's data. The text is read through the wire's own decoding,
// so what agents change between the requests of one conversation without
// changing what it says is left out: a cache_control added or moved (an
// agent marks the last message, which the first user message is only in
// the first request), spacing and field order, and <system-reminder>
// parts added or dropped (a resumed session's opening loses them). A
// message the wire cannot read counts by its first bytes as they are.
//
// It returns how many messages it read: a later request that takes them
// over byte for byte (a resumed scan) has the same fingerprint.
func fingerprint(w io.Writer, d *wire.Dialect, sp *wire.Spliced) int {
	var buf []byte
	for i, m := range sp.Marks {
		role := ""
		if i < len(sp.Messages) {
			role = string(sp.Messages[i].Role)
		}
		io.WriteString(w, role+"\x00")
		for _, sl := range slotsOf(sp, i) {
			if b := sl.Data.Of(sp.Body); len(b) > 0 {
				w.Write(b[:min(len(b), fingerprintBytes)])
				w.Write([]byte{0})
			}
		}
		// The message without its images' data: cheap to decode.
		var text []byte
		text, buf = textBytes(sp, i, buf)
		msgs, err := d.DecodeMessage(text)
		if err != nil {
			raw := sp.Body[m.Start:m.End]
			w.Write(raw[:min(len(raw), fingerprintBytes)])
		}
		for _, dm := range msgs {
			for _, p := range dm.Parts {
				if t, ok := p.(chat.Text); ok && !strings.HasPrefix(strings.TrimSpace(t.Text), "<system-reminder>") {
					io.WriteString(w, t.Text+"\x00")
				}
			}
		}
		w.Write([]byte{0})
		if role == "user" {
			return i + 1
		}
	}
	return len(sp.Marks)
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
