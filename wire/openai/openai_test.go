package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/wiretest"
)

func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestDecodeRequestGolden(t *testing.T) {
	r, err := DecodeRequest(read(t, "request.json"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "gpt-4o" || r.Stream {
		t.Fatalf("model %q stream %v", r.Model, r.Stream)
	}
	// The data URL is long; the golden file shows its start only.
	msgs := chat.CloneMessages(r.Messages)
	img := msgs[1].Parts[1].(chat.Image)
	img.URL = img.URL[:40] + "…"
	msgs[1].Parts[1] = img
	wiretest.Golden(t, "testdata/request.decoded.golden", wiretest.Dump(t, msgs))
}

// A request imgctx does not change passes through byte for byte.
func TestRequestPassesThroughByteStable(t *testing.T) {
	in := read(t, "request.json")
	in = bytes.TrimSpace(in)
	r, err := DecodeRequest(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := r.Encode(r.Messages, func(img chat.Image) (string, string, string, error) { return "", "", img.URL, nil })
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, in) {
		t.Fatalf("pass-through changed the request:\n%s\n%s", in, out)
	}
}

// What imgctx changes on purpose: images stored by ref are expanded to data
// URLs, a marker replaces a removed image; everything else stays.
func TestEncodeExpandsRefsGolden(t *testing.T) {
	r, err := DecodeRequest(read(t, "request.json"))
	if err != nil {
		t.Fatal(err)
	}
	msgs := chat.CloneMessages(r.Messages)
	ref := blob.Of([]byte("stored"))
	msgs[1].Parts[1] = chat.Image{Ref: ref, MediaType: "image/webp", Detail: "high", Origin: chat.FromUser}
	msgs[4].Parts[0] = chat.Marker{Of: "image", MediaType: "image/png", Caption: "old chart", Reason: "budget"}
	out, err := r.Encode(msgs, func(img chat.Image) (string, string, string, error) {
		if !img.Ref.Valid() {
			return "", "", img.URL, nil
		}
		return img.MediaType, "QUJD", "", nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var pretty bytes.Buffer
	json.Indent(&pretty, out, "", "  ")
	pretty.WriteByte('\n')
	wiretest.Golden(t, "testdata/request.encoded.golden", pretty.Bytes())
	if _, err := r.Encode(msgs, func(chat.Image) (string, string, string, error) { return "", "", "", errors.New("ref not found") }); err == nil {
		t.Fatal("an expansion error was swallowed")
	}
}

func TestStreamingRequestAsksForUsage(t *testing.T) {
	r, err := DecodeRequest([]byte(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := r.Encode(r.Messages, nil)
	if !strings.Contains(string(out), `"stream_options":{"include_usage":true}`) {
		t.Fatalf("got %s", out)
	}
}

// Regression: file and input_audio parts were refused with a 400. A file
// with its data is a document (stored by ref, sent back as a file part);
// audio, a file by id and unknown parts pass through as they came; other
// wires' fields are left out; nothing is HTML-escaped.
func TestPartsImgctxDoesNotManagePassThrough(t *testing.T) {
	in := `{"model":"m","messages":[{"role":"developer","content":"a < b & c"},` +
		`{"role":"user","content":[{"type":"text","text":"read"},{"type":"file","file":{"filename":"r.pdf","file_data":"data:application/pdf;base64,JVBERi0xLjQK"}},` +
		`{"type":"input_audio","input_audio":{"data":"UklG","format":"wav"}},{"type":"file","file":{"file_id":"file-abc"}},{"type":"future","x":1}]}]}`
	r, err := DecodeRequest([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	parts := r.Messages[1].Parts
	if d, ok := parts[1].(chat.Document); !ok || d.Name != "r.pdf" || !strings.HasPrefix(d.URL, "data:application/pdf") {
		t.Fatalf("file part: %#v", parts[1])
	}
	for _, i := range []int{2, 3, 4} {
		if _, ok := parts[i].(chat.Opaque); !ok {
			t.Fatalf("part %d: %#v; want opaque", i, parts[i])
		}
	}
	// Rewritten: the document stored by ref, every other part as it came.
	msgs := chat.CloneMessages(r.Messages)
	msgs[1].Parts[1] = chat.Document{Ref: blob.Of([]byte("%PDF")), MediaType: "application/pdf", Name: "r.pdf"}
	src := func(img chat.Image) (string, string, string, error) { return img.MediaType, "JVBERi0xLjQK", "", nil }
	out, err := r.Encode(msgs, src)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != in {
		t.Fatalf("got  %s\nwant %s", out, in)
	}
	// To an OpenAI upstream from an Anthropic-decoded turn: its extras and
	// opaque blocks stay behind.
	other := []chat.Message{{Role: chat.User, Wire: "anthropic", Extra: map[string]json.RawMessage{"x": []byte("1")},
		Parts: []chat.Part{chat.Text{Text: "hi", Extra: `{"cache_control":{"type":"ephemeral"}}`}, chat.Opaque{Wire: "anthropic", Raw: `{"type":"thinking"}`}}}}
	out, _ = NewRequest("m").Encode(other, src)
	if want := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`; string(out) != want {
		t.Fatalf("got  %s\nwant %s", out, want)
	}
}

func TestDecodeRequestRefusals(t *testing.T) {
	for name, in := range map[string]string{
		"not json":      `{"model":`,
		"no messages":   `{"model":"m"}`,
		"bad role":      `{"messages":[{"role":"robot","content":"x"}]}`,
		"image no url":  `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}`,
		"content type":  `{"messages":[{"role":"user","content":42}]}`,
		"messages type": `{"messages":{}}`,
	} {
		if _, err := DecodeRequest([]byte(in)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestDecodeResponseGolden(t *testing.T) {
	r, err := DecodeResponse(read(t, "response.json"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Usage == nil || r.Usage.Prompt != 2006 || r.Usage.CacheRead != 1920 || r.Usage.Output != 300 || r.Cut {
		t.Fatalf("usage %+v cut %v", r.Usage, r.Cut)
	}
	wiretest.Golden(t, "testdata/response.golden", wiretest.Dump(t, r))
}

func streamOf(t *testing.T, name string) *Response {
	t.Helper()
	sr := wire.NewSSEReader(bytes.NewReader(read(t, name)))
	var s Stream
	for {
		ev, err := sr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Add(ev.Data); err != nil {
			t.Fatal(err)
		}
	}
	if !s.Done() {
		t.Fatal("no [DONE]")
	}
	return s.Response()
}

func TestStreamGolden(t *testing.T) {
	r := streamOf(t, "stream.sse")
	if r.Usage == nil || r.Usage.Prompt != 1500 || r.Usage.CacheRead != 1024 || r.Finish != "tool_calls" {
		t.Fatalf("%+v", r)
	}
	wiretest.Golden(t, "testdata/stream.golden", wiretest.Dump(t, r))
	cut := streamOf(t, "stream-cut.sse")
	if !cut.Cut || cut.Usage.Prompt != 7900 {
		t.Fatalf("cut stream %+v", cut)
	}
	wiretest.Golden(t, "testdata/stream-cut.golden", wiretest.Dump(t, cut))
}

func TestErrorsGolden(t *testing.T) {
	cases := []struct {
		file   string
		status int
		retry  string
		want   wire.Kind
	}{
		{"error-context.json", 400, "", wire.PromptTooLong},
		{"error-ratelimit.json", 429, "3", wire.RateLimited},
		{"error-quota.json", 429, "", wire.BadRequest},
		{"error-image.json", 400, "", wire.InvalidImage},
		{"error-auth.json", 401, "", wire.Auth},
		{"error-server.html", 502, "", wire.Server},
	}
	var got []*wire.Error
	for _, c := range cases {
		h := http.Header{}
		if c.retry != "" {
			h.Set("Retry-After", c.retry)
		}
		e := DecodeError(c.status, h, read(t, c.file))
		if e.Kind != c.want {
			t.Errorf("%s: kind %s; want %s", c.file, e.Kind, c.want)
		}
		e.Body = nil
		got = append(got, e)
	}
	wiretest.Golden(t, "testdata/errors.golden", wiretest.Dump(t, got))
}

// Unknown fields of a content part survive when imgctx rewrites its
// message (an image stored by ref): some OpenAI-compatible gateways read
// cache_control on parts.
func TestPartExtrasSurviveARewrite(t *testing.T) {
	in := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"look","cache_control":{"type":"ephemeral"}},{"type":"image_url","image_url":{"url":"data:image/png;base64,QUJD"},"x_trace":7}]}]}`
	r, err := DecodeRequest([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	msgs := chat.CloneMessages(r.Messages)
	img := msgs[0].Parts[1].(chat.Image)
	img.URL, img.Ref, img.MediaType = "", blob.Of([]byte("ABC")), "image/png"
	msgs[0].Parts[1] = img
	out, err := r.Encode(msgs, func(chat.Image) (string, string, string, error) { return "image/png", "QUJD", "", nil })
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"look","cache_control":{"type":"ephemeral"}},{"type":"image_url","image_url":{"url":"data:image/png;base64,QUJD"},"x_trace":7}]}]}`
	if string(out) != want {
		t.Fatalf("got  %s\nwant %s", out, want)
	}
}

// The proxy reads only a response's usage: the same figures as a full
// decode, read from their spans (wire.Ints), not by encoding/json.
func TestResponseUsageMatchesDecode(t *testing.T) {
	b := read(t, "response.json")
	r, err := DecodeResponse(b)
	if err != nil {
		t.Fatal(err)
	}
	if u, _ := answer(b); u == nil || *u != *r.Usage {
		t.Fatalf("answer's usage %+v; DecodeResponse %+v", u, r.Usage)
	}
	raw, _ := wire.Member(b, "usage")
	if !wire.Ints(raw, usageKeys, make([]int, len(usageKeys))) {
		t.Errorf("the usage of response.json went to encoding/json: %s", raw)
	}
	for _, b := range []string{`{"choices":[]}`, `not json`} {
		if u, _ := answer([]byte(b)); u != nil {
			t.Fatalf("usage %+v from %s", u, b)
		}
	}
}

// Regression: re-encoded text and URLs were HTML-escapes ("<" → "\u003c"),
// so even an unchanged system prompt changed bytes.
func TestEncodingNeverHTMLEscapes(t *testing.T) {
	m := chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "a <b> & c"},
		chat.Image{URL: "https://example.com/a.png?x=1&y=<2>"}}}
	b, err := EncodeMessage(m, func(img chat.Image) (string, string, string, error) { return "", "", img.URL, nil })
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); strings.Contains(s, `\u00`) || !strings.Contains(s, "a <b> & c") || !strings.Contains(s, "x=1&y=<2>") {
		t.Fatalf("escaped: %s", s)
	}
}

// The usage-only chunk include_usage adds is recognised as JSON, whatever
// the upstream's spacing; a chunk with choices, or a usage that is null, is
// not it.
func TestUsageOnlyChunkWhateverTheSpacing(t *testing.T) {
	for data, want := range map[string]bool{
		`{"id":"c","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2}}`:          true,
		`{"id": "c", "choices": [ ], "usage": {"prompt_tokens": 10, "completion_tokens": 2}}`: true,
		"{\"choices\":\n[],\n\"usage\" :\n{\"prompt_tokens\":1}}":                             true,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"hi"}}],"usage":null}`:            false,
		`{"id":"c","choices":[],"usage":null}`:                                                false,
		`{"id":"c","choices":[{"index":0,"delta":{}}],"usage":{"prompt_tokens":10}}`:          false,
		`{"choices":[],"usage":{`: false,
	} {
		if got := usageOnly([]byte(data)); got != want {
			t.Errorf("usageOnly(%s) = %v; want %v", data, got, want)
		}
	}
}

// Issue "Hardening, third pass", item 2: the image forms vLLM, SGLang,
// llama.cpp and Ollama's OpenAI-compatible parsers read beside the
// standard one are managed
// (slots: stored, checked, counted, the SSRF guard on their URLs), never
// forwarded unchecked.
func TestScanManagesTheImageFormsCompatibleServersRead(t *testing.T) {
	for name, part := range map[string]string{
		"standard":             `{"type":"image_url","image_url":{"url":"https://example.com/a.png"}}`,
		"image_url as string":  `{"type":"image_url","image_url":"https://example.com/a.png"}`,
		"input_image":          `{"type":"input_image","image_url":"https://example.com/a.png"}`,
		"input_image, object":  `{"type":"input_image","image_url":{"url":"https://example.com/a.png"}}`,
		"no type, image_url":   `{"image_url":{"url":"https://example.com/a.png"}}`,
		"no type, string, b64": `{"image_url":"data:image/png;base64,iVBORw0KGgo="}`,
		// vLLM (entrypoints/chat_utils.py, _parse_chat_message_content_mm_part):
		// a part with a uuid is read by its fields whatever its type.
		"vLLM uuid, typed":  `{"type":"image_url","uuid":"u1","image_url":"https://example.com/a.png"}`,
		"vLLM uuid, object": `{"uuid":"u1","image_url":{"url":"https://example.com/a.png"}}`,
		// SGLang's image part carries a modalities hint in its image_url.
		"SGLang modalities": `{"type":"image_url","image_url":{"url":"https://example.com/a.png","modalities":"multi-images"}}`,
	} {
		sp, err := Scan([]byte(`{"model":"m","messages":[{"role":"user","content":[`+part+`]}]}`), wire.ScanOptions{})
		if err != nil || len(sp.Slots) != 1 || sp.Slots[0].Kind != "image" {
			t.Errorf("%s: %v, %d slots", name, err, len(sp.Slots))
		}
	}
}

// A proxied answer's usage and whether any choice was cut by max_tokens,
// read from the spans of the response without decoding the completion,
// whatever the JSON's escapes and spacing.
func TestAnswerReadsUsageAndCut(t *testing.T) {
	for _, c := range []struct {
		body string
		cut  bool
	}{
		{`{"choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":3}}`, false},
		{`{"choices":[{"finish_reason":"stop"},{"finish_reason":"length"}],"usage":{"prompt_tokens":12,"completion_tokens":3}}`, true},
		{`{ "usage" : {"prompt_tokens":12,"completion_tokens":3} , "choices" : [ { "finish_reason" : "\u006cength" } ] }`, true},
		{`{"choices":[{"message":{"content":"finish_reason: length"},"finish_reason":null}],"usage":{"prompt_tokens":12,"completion_tokens":3}}`, false},
	} {
		u, cut := Dialect.Answer([]byte(c.body))
		if u == nil || u.Prompt != 12 || u.Output != 3 || cut != c.cut {
			t.Errorf("%s: usage %+v, cut %v; want 12 and 3 tokens, cut %v", c.body, u, cut, c.cut)
		}
	}
}

// A turn decoded from Anthropic JSON (a sessions API conversation moved
// to an OpenAI model, a translated request) carries only fields valid on
// this wire: every part's and message's extra fields and the other wire's
// opaque blocks are left out, the parts themselves written as this wire's.
func TestOtherWiresExtrasAreLeftOut(t *testing.T) {
	pdf, shot := blob.Of([]byte("%PDF-1.7")), blob.Of([]byte("PNG"))
	cache := `{"cache_control":{"type":"ephemeral"}}`
	msgs := []chat.Message{
		{Role: chat.User, Wire: "anthropic", Extra: map[string]json.RawMessage{"x_anthropic": []byte(`1`)}, Parts: []chat.Part{
			chat.Text{Text: "read this", Extra: cache},
			chat.Document{Ref: pdf, MediaType: "application/pdf", Name: "spec.pdf", Extra: `{"citations":{"enabled":true}}`},
			chat.Image{Ref: shot, MediaType: "image/png", Extra: cache},
			chat.Opaque{Wire: "anthropic", Raw: `{"type":"search_result","source":"s"}`}}},
		{Role: chat.Assistant, Wire: "anthropic", Parts: []chat.Part{
			chat.Opaque{Wire: "anthropic", Raw: `{"type":"thinking","thinking":"hm","signature":"EqQB"}`},
			chat.ToolCall{ID: "call_1", Name: "look", Arguments: `{}`, Extra: cache}}},
		{Role: chat.Tool, Wire: "anthropic", Parts: []chat.Part{
			chat.ToolResult{CallID: "call_1", Name: "look", Extra: cache, Parts: []chat.Part{chat.Text{Text: "done", Extra: cache}}}}},
	}
	src := func(p chat.Image) (string, string, string, error) {
		if p.Ref == pdf {
			return "application/pdf", "JVBERi0xLjc=", "", nil
		}
		return "image/png", "UE5H", "", nil
	}
	out, err := NewRequest("m").Encode(msgs, src)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","messages":[` +
		`{"role":"user","content":[{"type":"text","text":"read this"},` +
		`{"type":"file","file":{"filename":"spec.pdf","file_data":"data:application/pdf;base64,JVBERi0xLjc="}},` +
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,UE5H"}}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"look","arguments":"{}"}}]},` +
		`{"role":"tool","content":"done","tool_call_id":"call_1"}]}`
	if string(out) != want {
		t.Fatalf("got  %s\nwant %s", out, want)
	}
}

// A document whose bytes were never stored goes out as it came: its
// extracted text, named, where there is only text; its data URL as the
// file part's data.
func TestDocumentsWithoutARef(t *testing.T) {
	m := chat.Message{Role: chat.User, Parts: []chat.Part{
		chat.Document{MediaType: "application/pdf", Text: "Page one."},
		chat.Document{URL: "data:application/pdf;base64,JVBE", MediaType: "application/pdf"}}}
	b, err := EncodeMessage(m, func(p chat.Image) (string, string, string, error) { return "", "", p.URL, nil })
	if err != nil {
		t.Fatal(err)
	}
	want := `{"role":"user","content":[{"type":"text","text":"[document: application/pdf]\nPage one."},{"type":"file","file":{"file_data":"data:application/pdf;base64,JVBE"}}]}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
}
