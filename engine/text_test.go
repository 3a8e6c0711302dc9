package engine

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/internal/bodies"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/gemini"
	"github.com/imgctx/imgctx/wire/openai"
	"github.com/imgctx/imgctx/wire/responses"
)

// The text a proxied request's messages bill is counted with their inline
// base64 left out (decoding a screenshot's megabyte to count the text
// around it took milliseconds), and comes to what decoding their whole
// bytes counts, on every wire: images and documents, in a tool's result or
// the user's own, their base64 with JSON escapes ("\/") or without.
func TestTextIsCountedWithoutTheInlineData(t *testing.T) {
	dataURL := screenshot(1280, 800, 7)
	_, b64, _ := strings.Cut(dataURL, ",")
	escaped := strings.ReplaceAll(b64, "/", `\/`)
	if escaped == b64 {
		t.Fatal("the screenshot's base64 has no slash to escape: pick another seed")
	}
	pdf := "JVBERi0xLjQKJcOkw7zDtsOfCjIgMCBvYmoKPDwvTGVuZ3RoIDMgMCBSL0ZpbHRlci9GbGF0ZURlY29kZT4+CnN0cmVhbQp4nDPQM1Qo5ypUMFAwALJMLU31jBQsTAz1LBSKUrnCtRTyuAIVAIJjB24KZW5kc3RyZWFtCmVuZG9iagoKMyAwIG9iago"
	bodies := []struct {
		d    *wire.Dialect
		body string
	}{
		{openai.Dialect, `{"model":"gpt-4o","messages":[` +
			`{"role":"system","content":"You operate a browser."},` +
			`{"role":"user","content":[{"type":"text","text":"What does the page say?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + escaped + `","detail":"high"}}]},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"screenshot","arguments":"{}"}}]},` +
			`{"role":"tool","tool_call_id":"c1","content":"taken"},` +
			`{"role":"user","content":[{"type":"text","text":"the screenshot you asked for"},{"type":"image_url","image_url":{"url":"` + dataURL + `"}}]}]}`},
		{anthropic.Dialect, `{"model":"claude-sonnet-4-6","max_tokens":100,"messages":[` +
			`{"role":"user","content":[{"type":"text","text":"Read this report and the screen."},{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` + pdf + `"}},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + escaped + `"}}]},` +
			`{"role":"assistant","content":[{"type":"text","text":"Taking a screenshot."},{"type":"tool_use","id":"t1","name":"computer","input":{"action":"screenshot"}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"text","text":"the screen now"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + b64 + `"}}]}]}]}`},
		{gemini.Dialect, `{"contents":[` +
			`{"role":"user","parts":[{"text":"What is on the screen?"},{"inlineData":{"mimeType":"image/png","data":"` + escaped + `"}}]},` +
			`{"role":"model","parts":[{"text":"A chart of sales by month."}]},` +
			`{"role":"user","parts":[{"text":"And now?"},{"inline_data":{"mime_type":"image/png","data":"` + b64 + `"}}]}]}`},
		{responses.Dialect, `{"model":"gpt-4o","input":[` +
			`{"role":"user","content":[{"type":"input_text","text":"Describe the screen."},{"type":"input_image","image_url":"data:image/png;base64,` + escaped + `"}]},` +
			`{"role":"assistant","content":[{"type":"output_text","text":"A login form."}]},` +
			`{"role":"user","content":[{"type":"input_text","text":"Fill it in."},{"type":"input_file","filename":"r.pdf","file_data":"data:application/pdf;base64,` + pdf + `"}]}]}`},
	}
	profile, ok := tokens.Default().Lookup("gpt-4o")
	if !ok {
		t.Fatal("no gpt-4o profile")
	}
	for _, c := range bodies {
		t.Run(c.d.Name, func(t *testing.T) {
			sp, err := c.d.Scan([]byte(c.body), wire.ScanOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(sp.Slots) < 2 {
				t.Fatalf("the scan found %d images or documents, the body has more", len(sp.Slots))
			}
			elided := 0 // messages whose bytes are decoded without their base64
			for i, m := range sp.Marks {
				want := m.End - m.Start
				for _, sl := range sp.Slots {
					if sl.Data.Start > m.Start && sl.Data.End < m.End {
						want -= sl.Data.End - sl.Data.Start - len(dataStandIn)
					}
				}
				raw, _ := textBytes(sp, i, nil)
				if len(raw) != want {
					t.Errorf("message %d: %d bytes decoded, %d without its base64", i, len(raw), want)
				}
				if want < m.End-m.Start {
					elided++
				}
			}
			if elided < 2 {
				t.Fatalf("%d messages decoded without their base64, the body has two with some", elided)
			}
			spy := *c.d // what textOf hands the decoder
			longest := 0
			spy.DecodeMessage = func(raw []byte) ([]chat.Message, error) {
				longest = max(longest, len(raw))
				return c.d.DecodeMessage(raw)
			}
			count := textOf(&spy, sp, profile)
			for from := range len(sp.Marks) + 1 {
				if got, want := count(from), wholeText(t, c.d, sp, profile, from); got != want {
					t.Errorf("messages[%d:]: %d tokens, %d decoding the whole bytes", from, got, want)
				}
			}
			if longest >= len(b64) {
				t.Errorf("the decoder was handed %d bytes, more than the screenshot's %d of base64", longest, len(b64))
			}
			if count(0) <= len(sp.Marks)*tokens.MessageFraming {
				t.Errorf("messages[0:] count %d tokens, no more than their framing", count(0))
			}
		})
	}
}

// wholeText counts messages[from:] as textOf did before it left the
// inline data out: each message decoded from all its bytes.
func wholeText(t testing.TB, d *wire.Dialect, sp *wire.Spliced, p tokens.Profile, from int) int {
	t.Helper()
	counter := tokens.CounterFor(p.Tokenizer)
	n := 0
	for i, m := range sp.Marks[from:] {
		n += tokens.MessageFraming
		msgs, err := d.DecodeMessage(sp.Body[m.Start:m.End])
		if err != nil {
			t.Fatalf("message %d: %v", from+i, err)
		}
		for _, dm := range msgs {
			n += policy.TextTokens(dm.Parts, counter)
		}
	}
	return n
}

// BenchmarkTextOfANewScreenshot: counting the text a computer-use step
// appends (the assistant's call and the tool's result, a 1280×800
// screenshot in it), as the proxy does for every request that brings an
// image to measure: decoding the messages' whole bytes, as before, and
// with the base64 left out.
//
//	go test ./engine -run XXX -bench TextOfANewScreenshot
func BenchmarkTextOfANewScreenshot(b *testing.B) {
	shot := "data:image/png;base64," + base64.StdEncoding.EncodeToString(bodies.Screenshot(1))
	body := bodies.AgentRounds([]string{shot}, 4) // the screenshot is in the fourth round's tool result
	sp, err := openai.Dialect.Scan(body, wire.ScanOptions{})
	if err != nil {
		b.Fatal(err)
	}
	profile, _ := tokens.Default().Lookup("gpt-4o")
	from := len(sp.Marks) - 3 // the round: the user's turn, the call, the result
	b.Run("whole-bytes", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			wholeText(b, openai.Dialect, sp, profile, from)
		}
	})
	b.Run("base64-left-out", func(b *testing.B) {
		b.ReportAllocs()
		count := textOf(openai.Dialect, sp, profile)
		for b.Loop() {
			count(from)
		}
	})
}
