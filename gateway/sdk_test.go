//go:build sdk

package gateway

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/imgctx/imgctx/upstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

func openaiClient(g *gw, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(g.srv.URL+"/v1"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

func imageMessage(text, url string) openai.ChatCompletionMessageParamUnion {
	return openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{
		openai.TextContentPart(text),
		openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: url}),
	})
}

// One image sent inline on 10 requests is stored once, and the upstream
// receives it byte-exact each time.
func TestOpenAISDKInlineImagesStoredOnce(t *testing.T) {
	g := newGW(t, upstream.OpenAI, map[string]string{"k-acme": "acme"})
	client := openaiClient(g, "k-acme")
	_, b64 := samplePNG(t)
	for i := range 10 {
		res, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
			Model:    "gpt-4o",
			Messages: []openai.ChatCompletionMessageParamUnion{imageMessage("What is this?", "data:image/png;base64,"+b64)},
		})
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if res.Choices[0].Message.Content != "A login form." {
			t.Fatalf("reply %q", res.Choices[0].Message.Content)
		}
	}
	if n := g.stored(t, "acme"); n != 1 {
		t.Fatalf("%d images stored; want 1", n)
	}
	for i, body := range g.up.received() {
		if !bytes.Contains(body, []byte(`"url":"data:image/png;base64,`+b64+`"`)) {
			t.Fatalf("request %d: the upstream did not get the image byte-exact", i)
		}
	}
	if m := metric(t, g, "imgctx_tokens_total"); !strings.Contains(m, `kind="input",model="gpt-4o"} 10500`) {
		t.Fatalf("usage not in /metrics:\n%s", m)
	}
}

// An image stored once is referred to by ref and expanded byte-exact.
func TestOpenAISDKRefExpanded(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	raw, b64 := samplePNG(t)
	resp, body := g.do(t, "POST", "/v1/images", "", raw, "Content-Type", "image/png")
	if resp.StatusCode != 201 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	ref := "sha256-534742a9a0be702e61ca5937b744994707ab2944ffb315b35a959ef1f5173e57"
	if !bytes.Contains(body, []byte(ref)) {
		t.Fatalf("ref: %s", body)
	}
	client := openaiClient(g, "any")
	_, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model: "gpt-4o", Messages: []openai.ChatCompletionMessageParamUnion{imageMessage("and this?", "imgctx:"+ref)}})
	if err != nil {
		t.Fatal(err)
	}
	if got := g.up.received()[0]; !bytes.Contains(got, []byte(b64)) {
		t.Fatal("the ref was not expanded to the stored bytes")
	}
}

// The upstream holds its second event until the client has received the
// first: a gateway that buffered the stream could not pass this test.
func TestOpenAISDKStreamsEventByEvent(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	g.up.gate = make(chan struct{})
	client := openaiClient(g, "x")
	stream := client.Chat.Completions.NewStreaming(t.Context(), openai.ChatCompletionNewParams{
		Model: "gpt-4o", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	var text strings.Builder
	chunks := 0
	for stream.Next() {
		if chunks == 0 {
			close(g.up.gate) // the first event arrived while the upstream waits
		}
		chunks++
		if c := stream.Current(); len(c.Choices) > 0 {
			text.WriteString(c.Choices[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	g.up.mu.Lock()
	buffered := g.up.gateTimedOut
	g.up.mu.Unlock()
	if buffered {
		t.Fatal("the first event reached the client only after the upstream gave up waiting: the stream was buffered")
	}
	// The usage chunk imgctx asks for reaches only a client that asked too.
	if text.String() != "A login form." || chunks != 4 {
		t.Fatalf("%d chunks, text %q", chunks, text.String())
	}
	if !bytes.Contains(g.up.received()[0], []byte(`"stream_options":{"include_usage":true}`)) {
		t.Fatal("usage not requested from the upstream")
	}
}

// Prompt too long: one replay without the older images; the current
// message keeps its image.
func TestOpenAISDKPromptTooLongRetriedOnce(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	g.up.maxImages = 1
	_, b64 := samplePNG(t)
	old := "data:image/png;base64," + b64
	client := openaiClient(g, "x")
	res, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model: "gpt-4o",
		Messages: []openai.ChatCompletionMessageParamUnion{
			imageMessage("first screenshot", old),
			openai.AssistantMessage("I see it."),
			imageMessage("and now?", strings.Replace(old, "iVBOR", "iVBOR", 1)),
		}})
	if err != nil {
		t.Fatal(err)
	}
	got := g.up.received()
	if len(got) != 2 || res.Choices[0].Message.Content == "" {
		t.Fatalf("%d upstream requests; want 2", len(got))
	}
	if countImages(got[1]) != 1 || !bytes.Contains(got[1], []byte("[image removed]")) {
		t.Fatalf("the replay: %d images, marker %v", countImages(got[1]), bytes.Contains(got[1], []byte("[image removed]")))
	}
	if m := metric(t, g, "imgctx_overflow_retries_total"); !strings.Contains(m, `{outcome="ok",reason="overflow"} 1`) {
		t.Fatalf("metrics:\n%s", m)
	}
}

// The user's images are not under the keep budget: they all go while the
// window has room. Under window pressure the older ones leave, oldest
// first, in one batch (reason window), and stay removed where they were —
// without any session header.
func TestOpenAISDKUserImagesLeaveOnlyUnderPressure(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	g.engine.KeepLowWater = 0.5 // the batch comes down to 19,000: room for the newest image
	raw, _ := samplePNG(t)
	shots := make([]string, 3)
	for i := range shots {
		// Three different 1280×800 images (1105 tokens each on the tile rule).
		shots[i] = "data:image/png;base64," + base64.StdEncoding.EncodeToString(distinctPNG(raw, i))
	}
	history := []openai.ChatCompletionMessageParamUnion{
		imageMessage("one", shots[0]), openai.AssistantMessage("ok"),
		imageMessage("two", shots[1]), openai.AssistantMessage("ok"),
		imageMessage("three", shots[2]), openai.AssistantMessage("ok"),
		openai.UserMessage("summarise"),
	}
	client := openaiClient(g, "x")
	send := func(msgs []openai.ChatCompletionMessageParamUnion) []byte {
		t.Helper()
		if _, err := client.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{Model: "tiny-vl", Messages: msgs}); err != nil {
			t.Fatal(err)
		}
		got := g.up.received()
		return got[len(got)-1]
	}
	// Budget 2,000 tokens (tiny-vl: a 20,000-token window), 3 × 1,105 of
	// user images: all sent.
	if first := send(history); countImages(first) != 3 || bytes.Contains(first, []byte("removed")) {
		t.Fatalf("%d images sent of 3", countImages(first))
	}
	// A long paste passes the proxy's relief point (the window: 20,000):
	// the estimate is the measured 3,050 plus ~18,000 of text; down to
	// 19,000 (the window less the budget, plus keep.low_water of it) the
	// two oldest go.
	history = append(history, openai.AssistantMessage("ok"), openai.UserMessage(strings.Repeat("log line ", 72000/9)))
	second := send(history)
	if countImages(second) != 1 || bytes.Count(second, []byte("[image removed]")) != 2 || !bytes.Contains(second, []byte(shots[2][40:200])) ||
		!strings.Contains(metric(t, g, "imgctx_images_total"), `{event="removed",reason="window"} 2`) {
		t.Fatalf("%d images, %d markers; want the newest kept, two removed (window)", countImages(second), bytes.Count(second, []byte("[image removed]")))
	}
	history = append(history, openai.AssistantMessage("ok"), openai.UserMessage("again"))
	third := send(history)
	if !bytes.HasPrefix(third, second[:bytes.LastIndex(second, []byte(`]`))-1]) {
		t.Fatal("the removals moved between requests of one conversation")
	}
	if m := metric(t, g, "imgctx_images_total"); !strings.Contains(m, `event="removed",reason="window"} 2`) || !strings.Contains(m, `event="not_sent",reason="window"} 4`) {
		t.Fatalf("metrics:\n%s", m)
	}
}

func TestAnthropicSDKImagesToolResultsAndStreaming(t *testing.T) {
	g := newGW(t, upstream.Anthropic, map[string]string{"k-acme": "acme"})
	client := anthropic.NewClient(aoption.WithBaseURL(g.srv.URL), aoption.WithAPIKey("k-acme"), aoption.WithMaxRetries(0))
	_, b64 := samplePNG(t)
	toolResult := anthropic.ToolResultBlockParam{ToolUseID: "toolu_1", Content: []anthropic.ToolResultBlockParamContentUnion{
		{OfText: &anthropic.TextBlockParam{Text: "captured"}},
		{OfImage: &anthropic.ImageBlockParam{Source: anthropic.ImageBlockParamSourceUnion{OfBase64: &anthropic.Base64ImageSourceParam{Data: b64, MediaType: anthropic.Base64ImageSourceMediaTypeImagePNG}}}},
	}}
	params := anthropic.MessageNewParams{
		Model: "claude-sonnet-4-6", MaxTokens: 256,
		Messages: []anthropic.MessageParam{
			anthropic.NewUserMessage(anthropic.NewTextBlock("Take a screenshot.")),
			anthropic.NewAssistantMessage(anthropic.NewToolUseBlock("toolu_1", map[string]any{}, "screenshot")),
			anthropic.NewUserMessage(anthropic.ContentBlockParamUnion{OfToolResult: &toolResult}),
		},
	}
	msg, err := client.Messages.New(t.Context(), params)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Content[0].Text != "A login form." {
		t.Fatalf("reply %+v", msg.Content)
	}
	body := g.up.received()[0]
	if !bytes.Contains(body, []byte(`"data":"`+b64+`"`)) || !bytes.Contains(body, []byte(`"tool_use_id":"toolu_1"`)) {
		t.Fatal("the tool result's image did not reach the upstream byte-exact")
	}
	if g.stored(t, "acme") != 1 {
		t.Fatal("the tool image was not stored")
	}
	stream := client.Messages.NewStreaming(t.Context(), params)
	var acc anthropic.Message
	events := 0
	for stream.Next() {
		events++
		if err := acc.Accumulate(stream.Current()); err != nil {
			t.Fatal(err)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	if events != 7 || acc.Content[0].Text != "A login form." {
		t.Fatalf("%d events, %+v", events, acc.Content)
	}
	if m := metric(t, g, "imgctx_tokens_total"); !strings.Contains(m, `kind="cache_read",model="claude-standard"} 1000`) {
		t.Fatalf("metrics:\n%s", m)
	}
}
