//go:build sdk

package gateway

import (
	"errors"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
)

// One process serves openai-go and anthropic-sdk-go clients at once, each
// routed to its own upstream.
func TestBothSDKsAgainstOneGatewayWithTwoUpstreams(t *testing.T) {
	g, ant := twoUpstreams(t)
	oc := openaiClient(g, "sk-user")
	res, err := oc.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model: "gpt-4o", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if err != nil || res.Choices[0].Message.Content != "A login form." {
		t.Fatalf("openai-go: %v %+v", err, res)
	}
	ac := anthropic.NewClient(aoption.WithBaseURL(g.srv.URL), aoption.WithAPIKey("sk-ant-user"), aoption.WithMaxRetries(0))
	msg, err := ac.Messages.New(t.Context(), anthropic.MessageNewParams{Model: "claude-sonnet-4-6", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	if err != nil || msg.Content[0].Text != "A login form." {
		t.Fatalf("anthropic-sdk-go: %v %+v", err, msg)
	}
	if len(g.up.received()) != 1 || len(ant.received()) != 1 {
		t.Fatalf("openai upstream got %d, anthropic upstream %d; want one each", len(g.up.received()), len(ant.received()))
	}
	// count_tokens goes to the Anthropic upstream too.
	ac.Messages.CountTokens(t.Context(), anthropic.MessageCountTokensParams{Model: "claude-sonnet-4-6",
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	if len(ant.received()) != 2 || len(g.up.received()) != 1 {
		t.Fatalf("count_tokens did not reach the Anthropic upstream")
	}
	// Models: each SDK sees its format's upstream; a model no upstream serves is a 404 in the client's shape.
	page, err := oc.Models.List(t.Context())
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != "gpt-4o" {
		t.Fatalf("openai models: %v %+v", err, page)
	}
	ap, err := ac.Models.List(t.Context(), anthropic.ModelListParams{})
	if err != nil || len(ap.Data) != 1 || ap.Data[0].ID != "claude-sonnet-4-6" {
		t.Fatalf("anthropic models: %v %+v", err, ap)
	}
	_, err = ac.Messages.New(t.Context(), anthropic.MessageNewParams{Model: "gemini-3-pro", MaxTokens: 5,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	var ae *anthropic.Error
	if !asError(err, &ae) || ae.StatusCode != 404 || !strings.Contains(ae.Error(), "no upstream of this gateway serves anthropic requests") {
		t.Fatalf("unrouted model: %v", err)
	}
}

func asError(err error, target **anthropic.Error) bool { return errors.As(err, target) }
