package sim

import (
	"encoding/base64"
	"net/http"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/tokens"
)

// A PDF is billed the same on every wire the emulated provider speaks —
// Anthropic's document block, a Chat Completions file part, a Responses
// input_file, Gemini's inlineData — as its pages and their shown text
// (pdfTokens); its pages are counted, and bytes that are not a PDF are
// refused as the providers refuse them.
func TestPDFsAreBilledOnEveryWire(t *testing.T) {
	pdf := base64.StdEncoding.EncodeToString([]byte("%PDF-1.4\n1 0 obj << /Type /Page >> endobj\n2 0 obj << /Type /Page >> endobj\n" +
		"3 0 obj << /Type /Pages >> endobj\nBT (Quarterly results) Tj ET\n%%EOF\n"))
	notPDF := base64.StdEncoding.EncodeToString([]byte("just text"))
	prof, ok := tokens.Default().Lookup("gemini-2.5-flash")
	if !ok {
		t.Fatal("no gemini-2.5-flash profile")
	}
	prof.Tokenizer = "chars4"
	for _, c := range []struct {
		wire, path string
		prof       tokens.Profile
		doc        func(data string) string // the PDF's part
		body       func(parts string) string
	}{
		{"anthropic", "/v1/messages", claudeLike,
			func(d string) string {
				return `{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` + d + `"}},`
			},
			func(parts string) string {
				return `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[` + parts + `{"type":"text","text":"Sum it up."}]}]}`
			}},
		{"chat", "/v1/chat/completions", gptLike,
			func(d string) string {
				return `{"type":"file","file":{"filename":"q.pdf","file_data":"data:application/pdf;base64,` + d + `"}},`
			},
			func(parts string) string {
				return `{"model":"m","messages":[{"role":"user","content":[` + parts + `{"type":"text","text":"Sum it up."}]}]}`
			}},
		{"responses", "/v1/responses", gptLike,
			func(d string) string {
				return `{"type":"input_file","filename":"q.pdf","file_data":"data:application/pdf;base64,` + d + `"},`
			},
			func(parts string) string {
				return `{"model":"m","input":[{"role":"user","content":[` + parts + `{"type":"input_text","text":"Sum it up."}]}]}`
			}},
		{"gemini", "/v1beta/models/gemini-2.5-flash:generateContent", prof,
			func(d string) string { return `{"inlineData":{"mimeType":"application/pdf","data":"` + d + `"}},` },
			func(parts string) string {
				return `{"contents":[{"role":"user","parts":[` + parts + `{"text":"Sum it up."}]}]}`
			}},
	} {
		t.Run(c.wire, func(t *testing.T) {
			p := NewProvider(c.prof, NewClock(), nil)
			post := func(body string) (int, Bill) {
				req, _ := http.NewRequest("POST", "http://provider"+c.path, strings.NewReader(body))
				resp, err := p.Transport().RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				b := p.Bills()
				return resp.StatusCode, b[len(b)-1]
			}
			var want block
			n, err := p.pdfTokens(pdf, &want)
			if err != nil || want.pages != 2 || (c.wire == "gemini" && n != 2*258) {
				t.Fatalf("pdfTokens: %d tokens, %d pages, %v (Gemini documents 258 tokens a page)", n, want.pages, err)
			}
			status, with := post(c.body(c.doc(pdf)))
			if status != 200 || with.Pages != 2 {
				t.Fatalf("with the PDF: %d, %+v", status, with)
			}
			p = NewProvider(c.prof, NewClock(), nil)
			status, without := post(c.body(""))
			if got := with.Prompt - without.Prompt; got != n {
				t.Fatalf("the PDF added %d prompt tokens (status %d without it); pdfTokens says %d", got, status, n)
			}
			p = NewProvider(c.prof, NewClock(), nil)
			if status, bill := post(c.body(c.doc(notPDF))); status != 400 || bill.Failed == "" {
				t.Fatalf("bytes that are not a PDF: %d, %+v", status, bill)
			}
		})
	}
}
