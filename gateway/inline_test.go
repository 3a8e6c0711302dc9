package gateway

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/upstream"
)

// Inline images in every position and field order are stored once; the
// upstream gets the client's bytes unchanged (standard base64 goes as it
// came). Text that merely looks like an image stays text.
func TestInlineImagesAreStoredAndSentAsTheyCame(t *testing.T) {
	_, b64 := samplePNG(t)
	cases := []struct {
		name, format, body string
		stored             int
	}{
		{"openai image url", "openai", `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + b64 + `"}}]}]}`, 1},
		{"data URL pasted in text stays", "openai", `{"model":"gpt-4o","messages":[{"role":"user","content":"see data:image/png;base64,` + b64 + `"}]}`, 0},
		{"escaped slashes in the URL", "openai", `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image\/png;base64,` + strings.ReplaceAll(b64, "/", `\/`) + `"}}]}]}`, 1},
		{"anthropic source, type first", "anthropic", `{"model":"claude-sonnet-4-6","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + b64 + `"}}]}]}`, 1},
		{"anthropic source, data first", "anthropic", `{"model":"claude-sonnet-4-6","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{"data":"` + b64 + `","media_type":"image/png","type":"base64"}}]}]}`, 1},
		{"anthropic data with escaped slashes", "anthropic", `{"model":"claude-sonnet-4-6","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image\/png","data":"` + strings.ReplaceAll(b64, "/", `\/`) + `"}}]}]}`, 1},
		{"anthropic text block named data", "anthropic", `{"model":"claude-sonnet-4-6","max_tokens":10,"messages":[{"role":"user","content":[{"type":"text","text":"x","data":"` + b64 + `"}]}]}`, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			g := newGW(t, upstream.Format(c.format), nil)
			path := "/v1/chat/completions"
			if c.format == "anthropic" {
				path = "/v1/messages"
			}
			resp, body := g.do(t, "POST", path, "", []byte(c.body))
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			if got := g.up.received(); len(got) != 1 || string(got[0]) != c.body {
				t.Fatalf("the upstream got another body:\n%.300s", got[0])
			}
			if n := g.stored(t, "default"); n != c.stored {
				t.Fatalf("stored %d images; want %d", n, c.stored)
			}
		})
	}
}

func TestBadInlineBase64IsRefused(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	resp, body := g.do(t, "POST", "/v1/chat/completions", "", []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,`+strings.Repeat("%", 2000)+`"}}]}]}`))
	if resp.StatusCode != 400 || len(g.up.received()) != 0 {
		t.Fatalf("status %d (%s), %d upstream requests; want 400 and none", resp.StatusCode, body, len(g.up.received()))
	}
}

// Base64 the upstream would not take as it came (URL-safe, unpadded) is
// sent in the standard encoding, and does not prime the cache.
func TestNonStandardBase64IsSentStandard(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	data, _ := samplePNG(t)
	sent := base64.RawURLEncoding.EncodeToString(data)
	resp, body := g.do(t, "POST", "/v1/chat/completions", "", []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,`+sent+`"}}]}]}`))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	want := `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + base64.StdEncoding.EncodeToString(data) + `"}}]}]}`
	if got := string(g.up.received()[0]); got != want {
		t.Fatalf("the upstream got %.200s…", got)
	}
}

// Regression (issue "Hardening", item 10): a request whose second image is
// refused stores none of its images, not even the good first one.
func TestRefusedRequestStoresNothing(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	_, b64 := samplePNG(t)
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + b64 + `"}},` +
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,` + base64.StdEncoding.EncodeToString([]byte("not a png at all")) + `"}}]}]}`
	resp, answer := g.do(t, "POST", "/v1/chat/completions", "", []byte(body))
	if resp.StatusCode/100 != 4 || g.stored(t, "default") != 0 || len(g.up.received()) != 0 {
		t.Fatalf("status %d (%s), %d stored, %d sent; want a 4xx and nothing stored or sent", resp.StatusCode, answer, g.stored(t, "default"), len(g.up.received()))
	}
}
