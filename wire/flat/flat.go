// Package flat speaks the backends that take one prompt string and one
// flat list of images instead of a conversation: llama.cpp server's
// /completion and Ollama's /api/generate. Their errors have OpenAI's shape
// and they take Bearer keys.
package flat

import (
	"encoding/json"
	"fmt"

	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/openai"
)

// LlamaCpp is llama.cpp server's /completion: {"prompt": {"prompt_string",
// "multimodal_data": [base64…]}} with one media marker per image (the
// server names its marker at GET /props); its answer has content,
// stop_type, tokens_evaluated and tokens_predicted.
var LlamaCpp = &wire.Dialect{
	Name: "llamacpp", Path: "/completion", Credentials: wire.Bearer, DecodeError: openai.DecodeError,
	Flat: &wire.Flat{Marked: true, MarkerPath: "/props", DefaultMarker: "<__media__>", Request: llamaRequest, Read: llamaRead},
}

// Ollama is Ollama's /api/generate: {"model", "prompt", "images"}; its
// answer has response, done_reason, prompt_eval_count and eval_count.
var Ollama = &wire.Dialect{
	Name: "ollama", Path: "/api/generate", Credentials: wire.Bearer, DecodeError: openai.DecodeError,
	Flat: &wire.Flat{Request: ollamaRequest, Read: ollamaRead},
}

func llamaRequest(_, prompt string, images []string) ([]byte, error) {
	if len(images) == 0 {
		return wire.Marshal(map[string]any{"prompt": prompt, "stream": false})
	}
	return wire.Marshal(map[string]any{"prompt": map[string]any{"prompt_string": prompt, "multimodal_data": images}, "stream": false})
}

func llamaRead(b []byte) (wire.Completion, error) {
	var r struct {
		Content         string `json:"content"`
		StopType        string `json:"stop_type"`
		TokensEvaluated int    `json:"tokens_evaluated"`
		TokensPredicted int    `json:"tokens_predicted"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return wire.Completion{}, fmt.Errorf("not a /completion answer: %w", err)
	}
	return wire.Completion{Text: r.Content, Cut: r.StopType == "limit", Prompt: r.TokensEvaluated, Output: r.TokensPredicted}, nil
}

func ollamaRequest(model, prompt string, images []string) ([]byte, error) {
	g := map[string]any{"model": model, "prompt": prompt, "stream": false}
	if len(images) > 0 {
		g["images"] = images
	}
	return wire.Marshal(g)
}

func ollamaRead(b []byte) (wire.Completion, error) {
	var r struct {
		Response        string `json:"response"`
		DoneReason      string `json:"done_reason"`
		PromptEvalCount int    `json:"prompt_eval_count"`
		EvalCount       int    `json:"eval_count"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return wire.Completion{}, fmt.Errorf("not an /api/generate answer: %w", err)
	}
	return wire.Completion{Text: r.Response, Cut: r.DoneReason == "length", Prompt: r.PromptEvalCount, Output: r.EvalCount}, nil
}
