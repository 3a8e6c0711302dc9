package anthropic

import (
	"bytes"
	"encoding/json"
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

func read(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSpace(b)
}

// passSource sends a URL image as a URL and a data URL as base64, as the
// engine would before ingesting.
func passSource(img chat.Image) (string, string, string, error) {
	if rest, ok := strings.CutPrefix(img.URL, "data:"); ok {
		meta, data, _ := strings.Cut(rest, ",")
		return strings.TrimSuffix(meta, ";base64"), data, "", nil
	}
	return "", "", img.URL, nil
}

func TestDecodeRequestGolden(t *testing.T) {
	r, err := DecodeRequest(read(t, "request.json"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "claude-sonnet-4-6" || r.Messages[0].Role != chat.System {
		t.Fatalf("model %q first role %s", r.Model, r.Messages[0].Role)
	}
	// The tool result (with its image) and the text after it are two messages.
	if r.Messages[3].Role != chat.Tool || r.Messages[4].Role != chat.User {
		t.Fatalf("roles %s %s", r.Messages[3].Role, r.Messages[4].Role)
	}
	tr := r.Messages[3].Parts[0].(chat.ToolResult)
	if img := tr.Parts[1].(chat.Image); img.Origin != chat.FromTool || img.MediaType != "image/webp" {
		t.Fatalf("tool image %+v", img)
	}
	msgs := chat.CloneMessages(r.Messages)
	img := tr.Parts[1].(chat.Image)
	img.URL = img.URL[:40] + "…"
	msgs[3].Parts[0].(chat.ToolResult).Parts[1] = img
	wiretest.Golden(t, "testdata/request.decoded.golden", wiretest.Dump(t, msgs))
}

func TestRequestPassesThroughByteStable(t *testing.T) {
	in := read(t, "request.json")
	r, err := DecodeRequest(in)
	if err != nil {
		t.Fatal(err)
	}
	// The system prompt's cache_control is the client's own: keep it.
	out, err := r.Encode(r.Messages, passSource, Cache{System: true})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, in) {
		t.Fatalf("pass-through changed the request:\n%s\n%s", in, out)
	}
}

func TestEncodeRefsAndBreakpointsGolden(t *testing.T) {
	r, err := DecodeRequest(read(t, "request.json"))
	if err != nil {
		t.Fatal(err)
	}
	msgs := chat.CloneMessages(r.Messages)
	tr := msgs[3].Parts[0].(chat.ToolResult)
	tr.Parts[1] = chat.Image{Ref: blob.Of([]byte("kept")), MediaType: "image/png", Origin: chat.FromTool, Keep: chat.Kept, Cost: 1334}
	msgs[3].Parts[0] = tr
	src := func(img chat.Image) (string, string, string, error) {
		if img.Ref.Valid() {
			return img.MediaType, "QUJD", "", nil
		}
		return passSource(img)
	}
	// Breakpoints: the system prompt and the turn holding the kept image.
	out, err := r.Encode(msgs, src, Cache{System: true, Messages: []int{3}})
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(out), `"cache_control"`); n != 2 {
		t.Fatalf("%d breakpoints; want 2", n)
	}
	var pretty bytes.Buffer
	json.Indent(&pretty, out, "", "  ")
	pretty.WriteByte('\n')
	wiretest.Golden(t, "testdata/request.encoded.golden", pretty.Bytes())
}

// Regression: thinking blocks, server-tool blocks, file sources, future
// block types and mid-conversation system messages were refused with a
// 400. They decode (opaque parts, system messages) and re-encode as they
// came, even when the message around them is rewritten.
func TestBlocksImgctxDoesNotManagePassThrough(t *testing.T) {
	in := `{"model":"m","max_tokens":5,"messages":[` +
		`{"role":"user","content":[{"type":"text","text":"a < b"},{"type":"image","source":{"type":"file","file_id":"file_1"}}]},` +
		`{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"EqQB"},{"type":"redacted_thinking","data":"EmwK"},{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{"q":"x"}},{"type":"text","text":"ok"}]},` +
		`{"role":"system","content":"Be brief."},` +
		`{"role":"user","content":[{"type":"future_block","x":[1,2]},{"type":"text","text":"go"}]}]}`
	r, err := DecodeRequest([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	opaque := 0
	for _, m := range r.Messages {
		for _, p := range m.Parts {
			if o, ok := p.(chat.Opaque); ok && o.Wire == Wire {
				opaque++
			}
		}
	}
	if opaque != 5 || r.Messages[2].Role != chat.System {
		t.Fatalf("%d opaque parts, message 2 is %s; want 5 and system", opaque, r.Messages[2].Role)
	}
	src := func(chat.Image) (string, string, string, error) { return "", "", "", nil }
	out, err := r.Encode(r.Messages, src, Cache{})
	if err != nil || string(out) != in {
		t.Fatalf("unchanged messages re-encoded differently (%v):\n%s", err, out)
	}
	// Rewritten (a breakpoint on every message): every opaque block, the
	// system message and the "<" still come out as they went in.
	out, err = r.Encode(r.Messages, src, Cache{Messages: []int{0, 1, 2, 3}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`{"type":"thinking","thinking":"hm","signature":"EqQB"}`, `{"type":"redacted_thinking","data":"EmwK"}`,
		`{"type":"image","source":{"type":"file","file_id":"file_1"}}`, `{"type":"future_block","x":[1,2]}`, `{"role":"system","content":[{"type":"text","text":"Be brief."`, `"a < b"`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("rewritten request lost %s:\n%s", want, out)
		}
	}
}

// A turn decoded from OpenAI JSON carries only fields valid on this wire.
func TestOtherWiresExtrasAreLeftOut(t *testing.T) {
	msgs := []chat.Message{{Role: chat.User, Wire: "openai", Extra: map[string]json.RawMessage{"name": []byte(`"alice"`)},
		Parts: []chat.Part{chat.Text{Text: "hi", Extra: `{"x_openai":1}`}, chat.Opaque{Wire: "openai", Raw: `{"type":"input_audio","input_audio":{"data":"UklG","format":"wav"}}`}}}}
	out, err := NewRequest("m", 5).Encode(msgs, nil, Cache{})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`; string(out) != want {
		t.Fatalf("got  %s\nwant %s", out, want)
	}
}

// The client's breakpoints count first: with four of its own (one on a
// non-last system block), imgctx adds none, and never a fifth.
func TestBreakpointsNeverExceedFour(t *testing.T) {
	in := `{"model":"m","max_tokens":5,"system":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}},{"type":"text","text":"b"}],"messages":[` +
		`{"role":"user","content":[{"type":"text","text":"1","cache_control":{"type":"ephemeral"}}]},{"role":"assistant","content":"2"},` +
		`{"role":"user","content":[{"type":"text","text":"3","cache_control":{"type":"ephemeral"}},{"type":"text","text":"4","cache_control":{"type":"ephemeral","ttl":"1h"}}]},{"role":"assistant","content":"5"},{"role":"user","content":"6"}]}`
	r, err := DecodeRequest([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	src := func(chat.Image) (string, string, string, error) { return "", "", "", nil }
	out, err := r.Encode(r.Messages, src, Cache{System: true, Messages: []int{3, len(r.Messages) - 1}})
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(out), `"cache_control"`); n != 4 {
		t.Fatalf("%d breakpoints with four of the client's; want 4:\n%s", n, out)
	}
	// One of the client's: imgctx's three newest fit, nothing more.
	r, _ = DecodeRequest([]byte(`{"model":"m","max_tokens":5,"system":[{"type":"text","text":"a","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"1"},{"role":"assistant","content":"2"},{"role":"user","content":"3"},{"role":"assistant","content":"4"},{"role":"user","content":"5"}]}`))
	out, _ = r.Encode(r.Messages, src, Cache{System: true, Messages: []int{1, 2, 3, 4, 5}})
	if n := strings.Count(string(out), `"cache_control"`); n != 4 || strings.Contains(string(out), `"1","cache_control"`) {
		t.Fatalf("%d breakpoints with one of the client's; want 4, the newest imgctx's:\n%s", n, out)
	}
}

// An image or document by URL (Anthropic's url source) is read as the
// URL, and written back as one, the URL unchanged; a source type imgctx
// does not know is the provider's, kept whole.
func TestURLSourcesRoundTrip(t *testing.T) {
	const img, pdf = "https://example.com/screen.png?s=1&t=2", "https://example.com/spec.pdf"
	in := `{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"` + img + `"}},` +
		`{"type":"document","source":{"type":"url","url":"` + pdf + `"}},` +
		`{"type":"image","source":{"type":"container_upload","file_id":"f_1"}}]}]}`
	r, err := DecodeRequest([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	parts := r.Messages[0].Parts
	if im, ok := parts[0].(chat.Image); !ok || im.URL != img {
		t.Fatalf("the image: %+v", parts[0])
	}
	if d, ok := parts[1].(chat.Document); !ok || d.URL != pdf {
		t.Fatalf("the document: %+v", parts[1])
	}
	if o, ok := parts[2].(chat.Opaque); !ok || !strings.Contains(o.Raw, `"container_upload"`) {
		t.Fatalf("an unknown source type: %+v", parts[2])
	}
	out, err := r.Encode(r.Messages, func(p chat.Image) (string, string, string, error) { return "", "", p.URL, nil }, Cache{})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`{"type":"image","source":{"type":"url","url":"https://example.com/screen.png?s=1&t=2"}}`,
		`{"type":"document","source":{"type":"url","url":"https://example.com/spec.pdf"}}`, `{"type":"image","source":{"type":"container_upload","file_id":"f_1"}}`} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("%s was not written back: %s", want, out)
		}
	}
}

func TestDecodeRequestRefusals(t *testing.T) {
	for name, in := range map[string]string{
		"not json":        `{"model":`,
		"no messages":     `{"model":"m"}`,
		"bad role":        `{"messages":[{"role":"robot","content":"x"}]}`,
		"image no source": `{"messages":[{"role":"user","content":[{"type":"image"}]}]}`,
		"empty base64":    `{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":""}}]}]}`,
		"nested result":   `{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"tool_result","tool_use_id":"b"}]}]}]}`,
		"url without url": `{"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url"}}]}]}`,
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
	// The three input fields are summed: 50 + 248 + 1800.
	if r.Usage.Prompt != 2098 || r.Usage.CacheRead != 1800 || r.Usage.CacheWrite != 248 || r.Usage.Output != 40 || r.Cut {
		t.Fatalf("%+v", r.Usage)
	}
	wiretest.Golden(t, "testdata/response.golden", wiretest.Dump(t, r))
}

func streamOf(t *testing.T, name string) *Stream {
	t.Helper()
	sr := wire.NewSSEReader(bytes.NewReader(read(t, name)))
	s := &Stream{}
	for {
		ev, err := sr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Add(ev.Name, ev.Data); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func TestStreamGolden(t *testing.T) {
	s := streamOf(t, "stream.sse")
	r := s.Response()
	if !s.Done() || r.Usage.Prompt != 2073 || r.Usage.Output != 33 || r.StopReason != "tool_use" {
		t.Fatalf("%+v %+v", r, r.Usage)
	}
	wiretest.Golden(t, "testdata/stream.golden", wiretest.Dump(t, r))
	w := streamOf(t, "stream-window.sse").Response()
	if !w.Cut || !w.WindowFull {
		t.Fatalf("window-full stream: %+v", w)
	}
	wiretest.Golden(t, "testdata/stream-window.golden", wiretest.Dump(t, w))
	e := streamOf(t, "stream-error.sse")
	if e.Err() == nil || e.Err().Kind != wire.Overloaded || e.Done() {
		t.Fatalf("error event: %+v", e.Err())
	}
}

// message_delta carries the final counts (server tools, and the API
// since 2025, put the whole usage there): what it gives replaces what
// message_start said, a count it leaves at zero keeps the start's, and a
// later stop replaces an earlier one.
func TestStreamUsageFromMessageDelta(t *testing.T) {
	s := &Stream{}
	for _, ev := range [][2]string{
		{"message_start", `{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_read_input_tokens":1500,"cache_creation_input_tokens":0,"output_tokens":1}}}`},
		{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":4}}`},
		{"message_delta", `{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":25,"cache_read_input_tokens":0,"cache_creation_input_tokens":300,"cache_creation":{"ephemeral_1h_input_tokens":300},"output_tokens":9}}`},
		{"message_stop", `{"type":"message_stop"}`},
	} {
		if err := s.Add(ev[0], []byte(ev[1])); err != nil {
			t.Fatal(err)
		}
	}
	r := s.Response()
	want := chat.Usage{Prompt: 25 + 1500 + 300, CacheRead: 1500, CacheWrite: 300, CacheWriteHour: 300, Output: 9}
	if !s.Done() || r.Usage == nil || *r.Usage != want || r.StopReason != "end_turn" {
		t.Fatalf("usage %+v, stop %q; want %+v, end_turn", r.Usage, r.StopReason, want)
	}
}

func TestErrorsGolden(t *testing.T) {
	cases := []struct {
		file   string
		status int
		want   wire.Kind
	}{
		{"error-prompt.json", 400, wire.PromptTooLong},
		{"error-context-legacy.json", 400, wire.PromptTooLong},
		{"error-image.json", 400, wire.InvalidImage},
		{"error-many-images.json", 400, wire.InvalidImage},
		{"error-overloaded.json", 529, wire.Overloaded},
		{"error-ratelimit.json", 429, wire.RateLimited},
		{"error-auth.json", 401, wire.Auth},
		{"error-too-large.json", 413, wire.RequestTooLarge},
	}
	var got []*wire.Error
	for _, c := range cases {
		h := http.Header{}
		if c.status == 429 {
			h.Set("Retry-After", "7")
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

// A client's own cache_control on a block survives a rewrite of its
// message, and imgctx does not add a second breakpoint there.
func TestBlockExtrasSurviveARewrite(t *testing.T) {
	in := `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"QUJD"},"cache_control":{"type":"ephemeral","ttl":"1h"}}]}]}`
	r, err := DecodeRequest([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	msgs := chat.CloneMessages(r.Messages)
	img := msgs[0].Parts[0].(chat.Image)
	img.URL, img.Ref = "", blob.Of([]byte("ABC"))
	msgs[0].Parts[0] = img
	out, err := r.Encode(msgs, func(chat.Image) (string, string, string, error) { return "image/png", "QUJD", "", nil }, Cache{Messages: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(out), "cache_control"); n != 1 || !strings.Contains(string(out), `"ttl":"1h"`) {
		t.Fatalf("%d breakpoints in %s", n, out)
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
}

// What other wires bring that this one writes its own way: a document of
// extracted text only as a text source, one by URL as a url source, an
// image the provider holds as a file by its id, and a tool call whose
// arguments are not JSON (a model's cut-off output, kept by OpenAI as a
// string) with an empty input — Anthropic refuses an input that is not an
// object.
func TestPartsFromOtherWiresAreWrittenNatively(t *testing.T) {
	msgs := []chat.Message{
		{Role: chat.User, Wire: "openai", Parts: []chat.Part{
			chat.Document{MediaType: "application/pdf", Name: "notes", Text: "Page one."},
			chat.Document{URL: "https://example.com/spec.pdf", MediaType: "application/pdf"},
			chat.Image{URL: wire.FileURL("file_9"), MediaType: "image/png"},
			chat.Image{URL: "https://example.com/a.png"}}},
		{Role: chat.Assistant, Wire: "openai", Parts: []chat.Part{chat.ToolCall{ID: "call_1", Name: "look", Arguments: `{"x":`}}},
	}
	src := func(img chat.Image) (string, string, string, error) { return "", "", img.URL, nil }
	out, err := NewRequest("m", 5).Encode(msgs, src, Cache{})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":[` +
		`{"type":"document","source":{"type":"text","media_type":"text/plain","data":"Page one."},"title":"notes"},` +
		`{"type":"document","source":{"type":"url","url":"https://example.com/spec.pdf"}},` +
		`{"type":"image","source":{"type":"file","file_id":"file_9"}},` +
		`{"type":"image","source":{"type":"url","url":"https://example.com/a.png"}}]},` +
		`{"role":"assistant","content":[{"type":"tool_use","id":"call_1","name":"look","input":{}}]}]}`
	if string(out) != want {
		t.Fatalf("got  %s\nwant %s", out, want)
	}
}

// An upstream's stream is read, not trusted: a delta for a block never
// started, or a block started out of its place, is an error naming the
// event, and what the stream said before it stands.
func TestStreamRefusesBlocksOutOfPlace(t *testing.T) {
	start := `{"type":"message_start","message":{"usage":{"input_tokens":10,"output_tokens":1}}}`
	for _, c := range []struct{ name, data, want string }{
		{"content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}`, "block index 0 out of range"},
		{"content_block_delta", `{"type":"content_block_delta","index":-1,"delta":{"type":"text_delta","text":"hi"}}`, "block index -1 out of range"},
		{"content_block_start", `{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}`, "block 1 started out of order"},
		{"ping", `{"type":`, "stream event \"ping\""},
	} {
		s := &Stream{}
		if err := s.Add("message_start", []byte(start)); err != nil {
			t.Fatal(err)
		}
		err := s.Add(c.name, []byte(c.data))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v; want one saying %q", c.data, err, c.want)
		}
		if r := s.Response(); r.Usage == nil || r.Usage.Prompt != 10 || len(r.Message.Parts) != 0 || s.Done() {
			t.Errorf("%s: after the refusal %+v, done %v", c.data, r, s.Done())
		}
	}
}
