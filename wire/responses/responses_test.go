package responses

import (
	"encoding/json"
	"testing"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/wiretest"
)

// A codex-shaped request: developer and user messages, reasoning with its
// encrypted content, a function call and its output holding a screenshot,
// an assistant message, a user message with a ref, a file_id image and a
// PDF, a compaction item, a custom tool output, an item reference.
func TestScanGolden(t *testing.T) {
	body := wiretest.ReadFile(t, "testdata/request.json")
	sp, err := Scan(body, wire.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wiretest.CheckSpliced(t, sp)
	if sp.Model != "gpt-5.1-codex" || !sp.Stream || sp.Compacted() != 7 {
		t.Fatalf("model %q stream %v compacted at %d", sp.Model, sp.Stream, sp.Compacted())
	}
	wiretest.Golden(t, "testdata/scan.golden", wiretest.Dump(t, wiretest.View(sp)))
}

// A string input, and a body without input (previous_response_id with
// nothing new), scan to nothing to manage.
func TestScanWithoutItems(t *testing.T) {
	for _, body := range []string{`{"model":"gpt-5","input":"hello"}`, `{"model":"gpt-5","previous_response_id":"resp_1"}`} {
		sp, err := Scan([]byte(body), wire.ScanOptions{})
		if err != nil || len(sp.Slots) != 0 || len(sp.Messages) != 0 {
			t.Fatalf("%s: %v %+v", body, err, sp)
		}
	}
}

// Refused: duplicate or case-variant managed keys, at the top level and in
// an item or a part, and invalid base64 characters in a part that is not a
// slot or in the member of a slot's part that is not its source.
func TestScanRefusals(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","input":[],"Input":[{"role":"user","content":[{"type":"input_image","image_url":"http://169.254.169.254/"}]}]}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AAAA","Image_url":"http://x/"}]}]}`,
		`{"model":"m","input":[{"type":"function_call_output","call_id":"a","output":[],"Output":[]}]}`,
		`{"model":"m","input":[{"type":"reasoning","content":[{"type":"input_image","image_url":"data:image/png;base64,` + "\x01" + `"}]}]}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AAAA","file_data":"data:a/b;base64,` + "\x01" + `"}]}]}`,
	} {
		if _, err := Scan([]byte(body), wire.ScanOptions{}); err == nil {
			t.Errorf("accepted %s", body)
		}
	}
}

func TestScanResumesExactly(t *testing.T) {
	body := wiretest.ReadFile(t, "testdata/request.json")
	wiretest.CheckResume(t, Scan, body)
	pretty, _ := json.MarshalIndent(json.RawMessage(body), "", "  ")
	wiretest.CheckResume(t, Scan, pretty)
}

// The usage of a response object and of a stream's final event, and a cut
// by max_output_tokens.
func TestUsage(t *testing.T) {
	u, cut, err := DecodeResponse([]byte(`{"id":"resp_1","object":"response","status":"completed","output":[],"usage":{"input_tokens":5000,"input_tokens_details":{"cached_tokens":4096},"output_tokens":12,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":5012}}`))
	if err != nil || cut || *u != (chat.Usage{Prompt: 5000, CacheRead: 4096, Output: 12}) {
		t.Fatalf("%+v %v %v", u, cut, err)
	}
	var s Stream
	s.Add([]byte(`{"type":"response.created","sequence_number":0,"response":{"status":"in_progress","usage":null}}`))
	if s.Done() {
		t.Fatal("done before the final event")
	}
	s.Add([]byte(`{"type":"response.incomplete","sequence_number":9,"response":{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":700,"input_tokens_details":{"cached_tokens":0},"output_tokens":64}}}`))
	if u, cut := s.Usage(); !s.Done() || !cut || u.Prompt != 700 {
		t.Fatalf("%+v %v", u, cut)
	}
}

// What an item bills as text, for measurements.
func TestDecodeItemText(t *testing.T) {
	for raw, want := range map[string]string{
		`{"role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_image","image_url":"data:x"}]}`: "hi",
		`{"type":"function_call","call_id":"c","name":"shell","arguments":"{\"a\":1}"}`:                             "shell\n{\"a\":1}",
		`{"type":"function_call_output","call_id":"c","output":"ok"}`:                                               "ok",
		`{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"saved"}]}`:             "saved",
	} {
		msgs, err := DecodeItem([]byte(raw))
		if err != nil || msgs[0].TextContent() != want {
			t.Errorf("%s: %q %v", raw, msgs[0].TextContent(), err)
		}
	}
}

// FuzzScan: any body is refused or scans to spans that hold together.
//
//	go test ./wire/responses -run XXX -fuzz FuzzScan -fuzztime 60s
func FuzzScan(f *testing.F) {
	f.Add(wiretest.ReadFile(f, "testdata/request.json"))
	f.Add([]byte(`{"model":"m","input":"hi"}`))
	wiretest.FuzzScan(f, Scan)
}

// FuzzResume: a scan resumed from any earlier body's gives a full scan's.
//
//	go test ./wire/responses -run XXX -fuzz FuzzResume -fuzztime 60s
func FuzzResume(f *testing.F) {
	b := wiretest.ReadFile(f, "testdata/request.json")
	f.Add(b, b)
	f.Add(b[:len(b)/2], b)
	wiretest.FuzzResume(f, Scan)
}

// FuzzDecodeResponse: response objects and stream events never panic.
func FuzzDecodeResponse(f *testing.F) {
	f.Add([]byte(`{"status":"incomplete","incomplete_details":{"reason":"max_output_tokens"},"usage":{"input_tokens":1}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		DecodeResponse(b)
		var s Stream
		s.Add(b)
		DecodeItem(b)
	})
}

// The documented response object and a stream cut by max_output_tokens,
// as the gateway reads them.
func TestResponseAndStreamGolden(t *testing.T) {
	u, cut, err := DecodeResponse(wiretest.ReadFile(t, "testdata/response.json"))
	if err != nil {
		t.Fatal(err)
	}
	wiretest.Golden(t, "testdata/response.golden", wiretest.Dump(t, map[string]any{
		"response": map[string]any{"usage": u, "cut": cut}, "stream": wiretest.Stream(t, Dialect, "testdata/stream.sse")}))
}
