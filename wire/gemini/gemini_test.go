package gemini

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/wiretest"
)

// A gemini-cli-shaped request: context and prompt, a thought and a function
// call with its signature, a function response whose parts carry the
// screenshot, the same screenshot pasted in snake_case, a file by URI, a
// PDF inline, audio inline (not imgctx's).
func TestScanGolden(t *testing.T) {
	body := wiretest.ReadFile(t, "testdata/request.json")
	sp, err := Scan(body, wire.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wiretest.CheckSpliced(t, sp)
	wiretest.Golden(t, "testdata/scan.golden", wiretest.Dump(t, wiretest.View(sp)))
}

func TestScanResumesExactly(t *testing.T) {
	body := wiretest.ReadFile(t, "testdata/request.json")
	wiretest.CheckResume(t, Scan, body)
	pretty, _ := json.MarshalIndent(json.RawMessage(body), "", "  ")
	wiretest.CheckResume(t, Scan, pretty)
}

// Refused: case-variant managed keys, duplicates, bad base64 in media that
// is not a slot.
func TestScanRefusals(t *testing.T) {
	for _, body := range []string{
		`{"contents":[],"Contents":[{"parts":[{"inlineData":{"mimeType":"image/png","data":"AAAA"}}]}]}`,
		`{"contents":[{"parts":[{"inlineData":{"mimeType":"image/png","data":"AAAA"},"InlineData":{}}]}]}`,
		`{"contents":[{"parts":[{"inlineData":{"mimeType":"image/png","data":"AAAA","Data":"BBBB"}}]}]}`,
		`{"contents":[{"parts":[{"inlineData":{"mimeType":"audio/wav","data":"` + "\x01" + `"}}]}]}`,
		`{"contents":[{"parts":[{"inlineData":{"mimeType":"image/png","data":"AAAA"},"inline_data":{"mime_type":"image/png","data":"BBBB"}}]}]}`,
		`{"contents":[{"parts":[{"inlineData":{"mimeType":"image/png","mime_type":"application/pdf","data":"AAAA"}}]}]}`,
	} {
		if _, err := Scan([]byte(body), wire.ScanOptions{}); err == nil {
			t.Errorf("accepted %s", body)
		}
	}
}

func TestUsageStreamAndErrors(t *testing.T) {
	u, cut, err := DecodeResponse([]byte(`{"candidates":[{"content":{"role":"model","parts":[{"text":"x"}]},"finishReason":"MAX_TOKENS"}],"usageMetadata":{"promptTokenCount":900,"candidatesTokenCount":5,"cachedContentTokenCount":512,"thoughtsTokenCount":3}}`))
	if err != nil || !cut || *u != (chat.Usage{Prompt: 900, CacheRead: 512, Output: 8}) {
		t.Fatalf("%+v %v %v", u, cut, err)
	}
	var s Stream
	s.Add([]byte(`{"candidates":[{"content":{"parts":[{"text":"a"}]}}],"usageMetadata":{"promptTokenCount":10}}`))
	if s.Done() {
		t.Fatal("done before a finish reason")
	}
	s.Add([]byte(`{"candidates":[{"content":{"parts":[{"text":"b"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":10,"candidatesTokenCount":2}}`))
	if u, cut := s.Usage(); !s.Done() || cut || u.Output != 2 {
		t.Fatalf("%+v %v", u, cut)
	}
	e := DecodeError(400, http.Header{}, []byte(`{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}`))
	if e.Kind != wire.PromptTooLong || e.Type != "INVALID_ARGUMENT" {
		t.Fatalf("%+v", e)
	}
	if e := DecodeError(429, http.Header{"Retry-After": {"3"}}, []byte(`{"error":{"code":429,"message":"Resource has been exhausted","status":"RESOURCE_EXHAUSTED"}}`)); e.Kind != wire.RateLimited || e.RetryAfter == 0 {
		t.Fatalf("%+v", e)
	}
	if e := DecodeError(400, http.Header{}, []byte(`{"error":{"code":400,"message":"Invalid value at 'contents[0]'","status":"INVALID_ARGUMENT"}}`)); e.Kind != wire.BadRequest {
		t.Fatalf("%+v", e)
	}
}

func TestDecodeContentText(t *testing.T) {
	msgs, err := DecodeContent([]byte(`{"role":"model","parts":[{"text":"hi"},{"functionCall":{"name":"f","args":{}}},{"functionResponse":{"name":"f","response":{"ok":true}}}]}`))
	if err != nil || len(msgs[0].Parts) != 4 {
		t.Fatalf("%+v %v", msgs, err)
	}
}

// FuzzScan: any body is refused or scans to spans that hold together.
//
//	go test ./wire/gemini -run XXX -fuzz FuzzScan -fuzztime 60s
func FuzzScan(f *testing.F) {
	f.Add(wiretest.ReadFile(f, "testdata/request.json"))
	wiretest.FuzzScan(f, Scan)
}

// FuzzResume: a scan resumed from any earlier body's gives a full scan's.
func FuzzResume(f *testing.F) {
	b := wiretest.ReadFile(f, "testdata/request.json")
	f.Add(b, b)
	f.Add(b[:len(b)/2], b)
	wiretest.FuzzResume(f, Scan)
}

// FuzzDecode: responses, stream chunks, errors and contents never panic.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"candidates":[{"finishReason":"MAX_TOKENS"}],"usageMetadata":{"promptTokenCount":1}}`))
	f.Add([]byte(`{"error":{"code":400,"message":"token limit exceeded","status":"INVALID_ARGUMENT"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		DecodeResponse(b)
		var s Stream
		s.Add(b)
		DecodeError(400, http.Header{}, b)
		DecodeContent(b)
	})
}

// The documented response, an alt=sse stream cut by MAX_TOKENS, and the
// documented error shapes, as the gateway reads them.
func TestResponseStreamAndErrorsGolden(t *testing.T) {
	u, cut, err := DecodeResponse(wiretest.ReadFile(t, "testdata/response.json"))
	if err != nil {
		t.Fatal(err)
	}
	var errs []map[string]any
	for _, e := range []struct {
		status int
		body   string
	}{
		{400, `{"error":{"code":400,"message":"The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}`},
		{400, `{"error":{"code":400,"message":"Unable to process input image. Please retry or report in https://developers.generativeai.google/guide/troubleshooting","status":"INVALID_ARGUMENT"}}`},
		{403, `{"error":{"code":403,"message":"Method doesn't allow unregistered callers.","status":"PERMISSION_DENIED"}}`},
		{429, `{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}`},
		{503, `{"error":{"code":503,"message":"The model is overloaded. Please try again later.","status":"UNAVAILABLE"}}`},
	} {
		we := DecodeError(e.status, http.Header{}, []byte(e.body))
		errs = append(errs, map[string]any{"status": we.Status, "kind": we.Kind, "type": we.Type, "message": we.Message})
	}
	wiretest.Golden(t, "testdata/decode.golden", wiretest.Dump(t, map[string]any{
		"response": map[string]any{"usage": u, "cut": cut}, "stream": wiretest.Stream(t, Dialect, "testdata/stream.sse"), "errors": errs}))
}

// Issue "Hardening, third pass", item 2: inline data whose MIME type is
// spelled as a lenient server still reads it is managed.
func TestScanManagesMIMESpellings(t *testing.T) {
	for _, mt := range []string{"image/png", "IMAGE/PNG", " image/png", "Image/Png "} {
		sp, err := Scan([]byte(`{"contents":[{"role":"user","parts":[{"inlineData":{"mimeType":"`+mt+`","data":"iVBORw0KGgo="}}]}]}`), wire.ScanOptions{})
		if err != nil || len(sp.Slots) != 1 || sp.Slots[0].MediaType != "image/png" {
			t.Errorf("%q: %v, %d slots", mt, err, len(sp.Slots))
		}
	}
}
