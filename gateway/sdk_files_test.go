//go:build sdk

package gateway

import (
	"encoding/base64"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/imgctx/imgctx/upstream"
	oai "github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"
	oresponses "github.com/openai/openai-go/v3/responses"
)

// The official SDKs through a gateway with file_ids auto: a conversation
// growing by one screenshot a request gets its answers, and each
// screenshot is uploaded once and named by file from then on.
func TestFileIDsWithTheSDKs(t *testing.T) {
	imgs := shots(t, 3)
	t.Run("anthropic-sdk-go", func(t *testing.T) {
		p := newFileProvider(t, upstream.Anthropic)
		g := filesGW(t, p, true)
		c := anthropic.NewClient(aoption.WithBaseURL(g.srv.URL), aoption.WithAPIKey("sk-ant-one"), aoption.WithMaxRetries(0))
		var msgs []anthropic.MessageParam
		for i, img := range imgs {
			msgs = append(msgs, anthropic.NewUserMessage(anthropic.NewTextBlock("the screen now"),
				anthropic.NewImageBlockBase64("image/png", base64.StdEncoding.EncodeToString(img))))
			res, err := c.Messages.New(t.Context(), anthropic.MessageNewParams{Model: "claude-sonnet-4-6", MaxTokens: 64, Messages: msgs})
			if err != nil || res.Content[0].Text != "ok" {
				t.Fatalf("request %d: %v %+v", i, err, res)
			}
			msgs = append(msgs, res.ToParam())
			bodies := p.received()
			if n := len(anthropicFileRef.FindAll(bodies[len(bodies)-1], -1)); n != i+1 {
				t.Fatalf("request %d names %d files, want %d", i, n, i+1)
			}
		}
		for i, img := range imgs {
			if n := p.uploadCounts()[digest(img)]; n != 1 {
				t.Errorf("screenshot %d uploaded %d times", i, n)
			}
		}
	})
	t.Run("openai-go responses", func(t *testing.T) {
		p := newFileProvider(t, upstream.OpenAI)
		g := filesGW(t, p, true)
		c := oai.NewClient(ooption.WithBaseURL(g.srv.URL+"/v1"), ooption.WithAPIKey("sk-one"), ooption.WithMaxRetries(0))
		var input oresponses.ResponseInputParam
		for i, img := range imgs {
			input = append(input, oresponses.ResponseInputItemParamOfMessage(oresponses.ResponseInputMessageContentListParam{
				{OfInputText: &oresponses.ResponseInputTextParam{Text: "the screen now"}},
				{OfInputImage: &oresponses.ResponseInputImageParam{ImageURL: oai.String("data:image/png;base64," + base64.StdEncoding.EncodeToString(img)), Detail: oresponses.ResponseInputImageDetailAuto}},
			}, "user"))
			res, err := c.Responses.New(t.Context(), oresponses.ResponseNewParams{Model: "gpt-4o",
				Input: oresponses.ResponseNewParamsInputUnion{OfInputItemList: input}})
			if err != nil || res.OutputText() != "ok" {
				t.Fatalf("request %d: %v %+v", i, err, res)
			}
			input = append(input, oresponses.ResponseInputItemParamOfOutputMessage(
				[]oresponses.ResponseOutputMessageContentUnionParam{{OfOutputText: &oresponses.ResponseOutputTextParam{Text: "ok"}}}, "msg_1", oresponses.ResponseOutputMessageStatusCompleted))
			bodies := p.received()
			if n := len(responsesFileRef.FindAll(bodies[len(bodies)-1], -1)); n != i+1 {
				t.Fatalf("request %d names %d files, want %d: %.300s", i, n, i+1, bodies[len(bodies)-1])
			}
		}
		for i, img := range imgs {
			if n := p.uploadCounts()[digest(img)]; n != 1 {
				t.Errorf("screenshot %d uploaded %d times", i, n)
			}
		}
	})
}
