//go:build sdk

package gateway

import (
	"bytes"
	"testing"

	oai "github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"
	oresponses "github.com/openai/openai-go/v3/responses"
)

// The official openai-go client's Responses API through the gateway: an
// image by data URL reaches the upstream as sent, stored once.
func TestResponsesWithTheOpenAISDK(t *testing.T) {
	rig := newResponsesRig(t, 200_000)
	client := oai.NewClient(ooption.WithBaseURL(rig.srv.URL+"/v1"), ooption.WithAPIKey("x"), ooption.WithMaxRetries(0))
	_, b64 := samplePNG(t)
	res, err := client.Responses.New(t.Context(), oresponses.ResponseNewParams{
		Model: "agent-1",
		Input: oresponses.ResponseNewParamsInputUnion{OfInputItemList: oresponses.ResponseInputParam{
			oresponses.ResponseInputItemParamOfMessage(oresponses.ResponseInputMessageContentListParam{
				{OfInputText: &oresponses.ResponseInputTextParam{Text: "What is on screen?"}},
				{OfInputImage: &oresponses.ResponseInputImageParam{ImageURL: oai.String("data:image/png;base64," + b64), Detail: oresponses.ResponseInputImageDetailHigh}},
			}, "user"),
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.OutputText() != "Done." || res.Usage.InputTokens == 0 {
		t.Fatalf("%+v", res)
	}
	body, billed := rig.up.last()
	if billed != 1334 || !bytes.Contains(body, []byte(`"image_url":"data:image/png;base64,`+b64+`"`)) {
		t.Fatal("the SDK's image did not reach the upstream as sent")
	}
}
