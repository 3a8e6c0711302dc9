//go:build sdk

package gateway

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"net/http"
	"testing"

	asdk "github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
)

// The seed's cases again with the official Anthropic SDK as the client:
// the reply appended as the SDK gives it back (Message.ToParam), tool
// results with a screenshot, a new question at the next turn.
func TestProxySeedWithTheAnthropicSDK(t *testing.T) {
	run := func(window int, keep string) (*agentRig, [][]byte) {
		rig := newAgentRig(t, window, &session.Mem{})
		client := asdk.NewClient(aoption.WithBaseURL(rig.srv.URL), aoption.WithAPIKey("k"), aoption.WithMaxRetries(0),
			aoption.WithHeader("X-Imgctx-Keep-Turn-Images", keep))
		raw, _ := samplePNG(t)
		msgs := []asdk.MessageParam{asdk.NewUserMessage(asdk.NewTextBlock("Open the login page."))}
		var sent [][]byte
		call := func(next reply) *asdk.Message {
			rig.up.mu.Lock()
			rig.up.next = next
			rig.up.mu.Unlock()
			m, err := client.Messages.New(t.Context(), asdk.MessageNewParams{Model: "agent-1", MaxTokens: 256, Messages: msgs})
			if err != nil {
				t.Fatal(err)
			}
			body, _ := rig.up.last()
			sent = append(sent, body)
			msgs = append(msgs, m.ToParam())
			return m
		}
		shot := 0
		answer := func(m *asdk.Message) {
			var results []asdk.ContentBlockParamUnion
			for _, b := range m.Content {
				if b.Type != "tool_use" {
					continue
				}
				shot++
				img := asdk.NewImageBlockBase64("image/png", base64.StdEncoding.EncodeToString(distinctPNG(raw, shot)))
				results = append(results, asdk.ContentBlockParamUnion{OfToolResult: &asdk.ToolResultBlockParam{ToolUseID: b.ID,
					Content: []asdk.ToolResultBlockParamContentUnion{{OfText: &asdk.TextBlockParam{Text: "captured"}}, {OfImage: img.OfImage}}}})
			}
			msgs = append(msgs, asdk.NewUserMessage(results...))
		}
		answer(call(reply{tools: 1}))
		answer(call(reply{tools: 1}))
		call(reply{})
		msgs = append(msgs, asdk.NewUserMessage(asdk.NewTextBlock("And the next page?")))
		call(reply{})
		return rig, sent
	}
	// 200k window: both kept at the billed cost; the switch changes
	// nothing in the turn, and takes both away at the next turn when off.
	on, onSent := run(200_000, "on")
	off, offSent := run(200_000, "off")
	for i := range 3 {
		if !bytes.Equal(onSent[i], offSent[i]) {
			t.Fatalf("request %d of the turn differs with the switch on and off", i+1)
		}
	}
	if bytes.Count(onSent[3], []byte(`"type":"image"`)) != 2 || on.counter("kept", "") != 2 {
		t.Fatalf("switch on: %d images at the next turn, %d kept", bytes.Count(onSent[3], []byte(`"type":"image"`)), on.counter("kept", ""))
	}
	// The opening message went as the SDK sent it: the key is found from it.
	sp, _ := anthropic.Scan(onSent[0], wire.ScanOptions{})
	if p, err := on.stored().LoadProxied(t.Context(), "default", engine.ConversationKey("default", anthropic.Dialect, http.Header{}, sp)); err != nil {
		t.Fatal(err)
	} else if n, cost := kept(p); n != 2 || cost != 2*1334 {
		t.Fatalf("%d kept at %d tokens; want 2 at the billed 1334 each", n, cost)
	}
	if bytes.Count(offSent[3], []byte(`[image removed]`)) != 2 || off.counter("removed", "key_off") != 2 {
		t.Fatal("switch off: the next turn still carries the tool images")
	}
	// 20k window, budget 2,000: the second is ephemeral, a marker next turn.
	small, smallSent := run(20_000, "on")
	if bytes.Count(smallSent[2], []byte(`"type":"image"`)) != 2 || bytes.Count(smallSent[3], []byte(`[image removed]`)) != 1 || small.counter("removed", "budget") != 1 {
		t.Fatal("over the budget: the image was not sent through its turn, or not a counted marker at the next")
	}
}

// The reactive net and a cut completion, with the Anthropic SDK as the
// client: prompt too long is answered by one replay without the kept
// image; a cut completion measures nothing and its image leaves at the
// next turn, unmeasured.
func TestProxyReactiveNetAndCutWithTheAnthropicSDK(t *testing.T) {
	rig := newAgentRig(t, 200_000, &session.Mem{})
	client := asdk.NewClient(aoption.WithBaseURL(rig.srv.URL), aoption.WithAPIKey("k"), aoption.WithMaxRetries(0))
	raw, _ := samplePNG(t)
	msgs := []asdk.MessageParam{asdk.NewUserMessage(asdk.NewTextBlock("Open the login page."))}
	call := func(next reply) (*asdk.Message, error) {
		rig.up.mu.Lock()
		rig.up.next = next
		rig.up.mu.Unlock()
		m, err := client.Messages.New(t.Context(), asdk.MessageNewParams{Model: "agent-1", MaxTokens: 256, Messages: msgs})
		if err == nil {
			msgs = append(msgs, m.ToParam())
		}
		return m, err
	}
	shot := 0
	answer := func(m *asdk.Message) {
		shot++
		img := asdk.NewImageBlockBase64("image/png", base64.StdEncoding.EncodeToString(distinctPNG(raw, shot)))
		msgs = append(msgs, asdk.NewUserMessage(asdk.ContentBlockParamUnion{OfToolResult: &asdk.ToolResultBlockParam{ToolUseID: m.Content[0].ID,
			Content: []asdk.ToolResultBlockParamContentUnion{{OfImage: img.OfImage}}}}))
	}
	m, err := call(reply{tools: 1})
	if err != nil {
		t.Fatal(err)
	}
	answer(m)
	if _, err := call(reply{}); err != nil {
		t.Fatal(err)
	}
	// Turn 2: the kept screenshot alone is over the upstream's limit.
	msgs = append(msgs, asdk.NewUserMessage(asdk.NewTextBlock("And now?")))
	rig.up.overflow = 1000
	before := rig.up.calls
	if _, err := call(reply{tools: 1}); err != nil {
		t.Fatalf("the replay without the kept image failed: %v", err)
	}
	if body, _ := rig.up.last(); rig.up.calls-before != 2 || !bytes.Contains(body, []byte("[image removed]")) || rig.counter("removed", "overflow") != 1 {
		t.Fatalf("%d attempts; the replay has the overflow marker: %v", rig.up.calls-before, bytes.Contains(body, []byte("[image removed]")))
	}
	rig.up.overflow = 0
	// A new screenshot, answered by a cut completion: not measured.
	answer(&asdk.Message{Content: []asdk.ContentBlockUnion{{ID: fmt.Sprintf("toolu_%d_0", rig.up.answered)}}})
	if m, err := call(reply{cut: true}); err != nil || m.StopReason != "max_tokens" {
		t.Fatalf("cut completion: %v %v", err, m)
	}
	msgs = append(msgs, asdk.NewUserMessage(asdk.NewTextBlock("Go on.")))
	if _, err := call(reply{}); err != nil {
		t.Fatal(err)
	}
	if body, _ := rig.up.last(); bytes.Count(body, []byte("[image removed]")) != 2 || rig.counter("removed", "unmeasured") != 1 || rig.counter("removed", "overflow") != 1 {
		t.Fatal("the next turn lacks the unmeasured marker, or the overflow removal moved")
	}
}
