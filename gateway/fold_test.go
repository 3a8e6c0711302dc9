package gateway

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/upstream"
)

// On the Chat Completions wire a client relays a tool's screenshot in a
// user message after the tool message. Once that screenshot is removed,
// its marker goes at the end of the tool message and the relay is left
// out — a message would cost its framing on every later request, more than
// the marker —; a relay that says something of its own stays, its image a
// marker in place. Nothing removed, nothing folded.
func TestARemovedRelayFoldsIntoItsToolMessage(t *testing.T) {
	raw, _ := samplePNG(t)
	g := newGW(t, upstream.OpenAI, nil)
	img := func(k int) string {
		return `{"type":"image_url","image_url":{"url":"data:image/png;base64,` + base64.StdEncoding.EncodeToString(distinctPNG(raw, k)) + `"}}`
	}
	msgs := []string{`{"role":"user","content":"look"}`}
	for k := range 3 {
		id := fmt.Sprintf("c%d", k)
		msgs = append(msgs, `{"role":"assistant","content":null,"tool_calls":[{"id":"`+id+`","type":"function","function":{"name":"screenshot","arguments":"{}"}}]}`,
			`{"role":"tool","tool_call_id":"`+id+`","content":"taken"}`)
		if k == 1 {
			msgs = append(msgs, `{"role":"user","content":[{"type":"text","text":"Attached media from tool result:"},`+img(k)+`]}`)
		} else {
			msgs = append(msgs, `{"role":"user","content":[`+img(k)+`]}`)
		}
		resp, b := g.do(t, "POST", "/v1/chat/completions", "", []byte(`{"model":"tiny-vision","messages":[`+strings.Join(msgs, ",")+`]}`),
			"X-Imgctx-Keep-Turn-Images", "off", "X-Imgctx-Session", "fold")
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
		if k < 2 {
			msgs = append(msgs, `{"role":"assistant","content":"done"}`, `{"role":"user","content":"next"}`) // a turn a screenshot
		}
	}
	up := g.up.received()
	var first, last struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(up[0], &first); err != nil || len(first.Messages) != 4 {
		t.Fatalf("the first request, nothing removed: %d messages (%v)", len(first.Messages), err)
	}
	if err := json.Unmarshal(up[len(up)-1], &last); err != nil {
		t.Fatal(err)
	}
	var roles []string
	for _, m := range last.Messages {
		roles = append(roles, m.Role)
	}
	// The first relay folded; the second, with its own text, kept; the
	// third's screenshot is the one shown.
	if got, want := strings.Join(roles, " "), "user assistant tool assistant user assistant tool user assistant user assistant tool user"; got != want {
		t.Fatalf("roles %s; want %s", got, want)
	}
	if got := string(last.Messages[2].Content); got != `"taken [image removed]"` {
		t.Fatalf("the folded tool message: %s", got)
	}
	if got := string(last.Messages[6].Content); got != `"taken"` {
		t.Fatalf("the tool message of the relay that stays: %s", got)
	}
	if kept := string(last.Messages[7].Content); !strings.Contains(kept, "Attached media") || !strings.Contains(kept, "[image removed]") || strings.Contains(kept, "image_url") {
		t.Fatalf("the relay with its own text: %s", kept)
	}
	if !strings.Contains(string(last.Messages[12].Content), "image_url") {
		t.Fatalf("the newest screenshot was not shown: %s", last.Messages[12].Content)
	}
}
