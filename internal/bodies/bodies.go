// Package bodies builds the agent-shaped request bodies that imgctx's
// benchmarks send (the in-process Go benchmarks and the A/B meter through
// real processes): a long OpenAI-format history of text messages with tool
// calls and a few screenshots, as coding agents send it, and a 1 KB text
// request. Deterministic: the same call gives the same bytes.
package bodies

import (
	"bytes"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math/rand/v2"
	"strings"
)

// Small is a 1 KB text request.
func Small() []byte {
	b, _ := json.Marshal(map[string]any{"model": "gpt-4o", "messages": []any{
		map[string]any{"role": "user", "content": strings.Repeat("word ", 190)}}})
	return b
}

// Screenshot is a 1280×800 PNG that looks like a screen: flat panels and
// text-like rows, with a noisy region so it weighs ≈225 KB.
func Screenshot(seed uint64) []byte {
	img := image.NewRGBA(image.Rect(0, 0, 1280, 800))
	r := rand.New(rand.NewPCG(seed, 1))
	for y := range 800 {
		for x := range 1280 {
			c := color.RGBA{240, 240, 245, 255}
			switch {
			case y < 40:
				c = color.RGBA{40, 44, 52, 255}
			case x < 220:
				c = color.RGBA{230, 232, 236, 255}
			case y%24 < 12 && x%97 < 80 && y < 500:
				c = color.RGBA{60, 60, 60, 255}
			case x >= 600 && x < 880 && y >= 520 && y < 790:
				c = color.RGBA{uint8(r.IntN(256)), uint8(r.IntN(256)), uint8(r.IntN(256)), 255}
			}
			img.SetRGBA(x, y, c)
		}
	}
	var buf bytes.Buffer
	png.Encode(&buf, img)
	return buf.Bytes()
}

// Agent is an OpenAI-format agent history: a system prompt, 50 rounds of
// user text, an assistant tool call, its tool result and an assistant reply
// (200 messages), tool results 3, 11, 19, … carrying the image URLs given
// (data URLs or imgctx: refs), one each, until they run out.
func Agent(urls []string) []byte { return AgentRounds(urls, 50) }

// AgentRounds is Agent with rounds rounds (4 messages each, after the
// system prompt): the same bytes up to where the shorter one ends, as an
// agent's history grows request after request.
func AgentRounds(urls []string, rounds int) []byte {
	r := rand.New(rand.NewPCG(42, 42))
	words := strings.Fields(`the func return err if nil := for range "quoted" path/to/file.go line ` +
		`é ü — <tag> & {"k": [1, 2]} \n tab	newline`)
	text := func(n int) string {
		var b strings.Builder
		for b.Len() < n {
			b.WriteString(words[r.IntN(len(words))])
			if r.IntN(12) == 0 {
				b.WriteString("\n")
			} else {
				b.WriteString(" ")
			}
		}
		return b.String()
	}
	msgs := []any{map[string]any{"role": "system", "content": text(6000)}}
	for i := range rounds {
		id := fmt.Sprintf("call_%03d", i)
		args, _ := json.Marshal(map[string]any{"path": fmt.Sprintf("src/file%d.go", i), "pattern": text(200)})
		result := any(text(1500))
		if i%8 == 3 && len(urls) > 0 {
			result = []any{map[string]any{"type": "text", "text": text(300)},
				map[string]any{"type": "image_url", "image_url": map[string]any{"url": urls[0]}}}
			urls = urls[1:]
		}
		msgs = append(msgs,
			map[string]any{"role": "user", "content": text(1200)},
			map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": id, "type": "function",
				"function": map[string]any{"name": "grep", "arguments": string(args)}}}},
			map[string]any{"role": "tool", "tool_call_id": id, "content": result},
			map[string]any{"role": "assistant", "content": text(800)})
	}
	b, _ := json.Marshal(map[string]any{"model": "gpt-4o", "messages": msgs, "temperature": 0,
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "grep", "parameters": map[string]any{"type": "object"}}}}})
	return b
}
