//go:build sdk

package gateway

import (
	"testing"

	"github.com/imgctx/imgctx/upstream"
	oai "github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"
)

// The official openai-go client on a llama.cpp backend.
func TestFlatWithTheOpenAISDK(t *testing.T) {
	r := newFlatRig(t, upstream.LlamaCpp, nil, nil)
	client := oai.NewClient(ooption.WithBaseURL(r.url+"/v1"), ooption.WithAPIKey("x"), ooption.WithMaxRetries(0))
	res, err := client.Chat.Completions.New(t.Context(), oai.ChatCompletionNewParams{Model: "agent-1",
		Messages: []oai.ChatCompletionMessageParamUnion{imageMessage("What is on screen?", "data:image/png;base64,"+r.shot(1))}})
	if err != nil {
		t.Fatal(err)
	}
	if _, images, _ := r.up.last(); res.Choices[0].Message.Content != "Done." || len(images) != 1 || res.Usage.CompletionTokens != 3 {
		t.Fatalf("%+v", res)
	}
}
