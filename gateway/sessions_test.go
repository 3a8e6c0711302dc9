package gateway

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/upstream"
	"github.com/prometheus/client_golang/prometheus"
)

// newSession creates a session with the settings in body, as key, and
// returns its id; any answer but 201 fails the test.
func (g *gw) newSession(t *testing.T, key, body string) string {
	t.Helper()
	resp, b := g.do(t, "POST", "/v1/sessions", key, []byte(body))
	if resp.StatusCode != 201 {
		t.Fatalf("creating a session: %d %s", resp.StatusCode, b)
	}
	return decodeJSON(t, b)["id"].(string)
}

func decodeJSON(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return m
}

// The sessions API runs the engine's turn loop: a tool screenshot kept at
// its measured cost, the published history, the breakdown, the export.
func TestSessionsAPI(t *testing.T) {
	g := newGW(t, upstream.OpenAI, map[string]string{"k": "acme"})
	g.up.toolCalls = []string{"screenshot"}
	id := g.newSession(t, "k", `{"model":"gpt-4o","keep_turn_images":true}`)
	resp, body := g.do(t, "POST", "/v1/sessions/"+id+"/turn", "k", []byte(`{"messages":[{"role":"user","content":"Open the login page."}]}`))
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"turn_end":false`)) || !bytes.Contains(body, []byte(`"tool_calls"`)) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	_, b64 := samplePNG(t)
	tool := fmt.Sprintf(`{"messages":[{"role":"tool","tool_call_id":"call_1","content":[{"type":"text","text":"captured"},{"type":"image_url","image_url":{"url":"data:image/png;base64,%s"}}]}]}`, b64)
	resp, body = g.do(t, "POST", "/v1/sessions/"+id+"/turn", "k", []byte(tool))
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"turn_end":true`)) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	// This fake charges 1000 tokens per image and none for text or framing,
	// so the measured share is 1000 less the appended text and framing the
	// engine subtracts (engine tests price both and check the share exactly).
	var turn struct {
		Events []struct {
			Kind   string
			Tokens int
		}
	}
	json.Unmarshal(body, &turn)
	cost := 0
	for _, e := range turn.Events {
		if e.Kind == "kept" {
			cost = e.Tokens
		}
	}
	if cost < 980 || cost > 1000 {
		t.Fatalf("kept at %d tokens; events: %s", cost, body)
	}
	resp, body = g.do(t, "GET", "/v1/sessions/"+id, "k", nil)
	s := decodeJSON(t, body)
	ctx := s["context"].(map[string]any)
	if resp.StatusCode != 200 || ctx["kept_images"].(float64) != 1 || ctx["kept_cost"].(float64) != float64(cost) || ctx["context_window"].(float64) != 128000 {
		t.Fatalf("%d context %v", resp.StatusCode, ctx)
	}
	if !bytes.Contains(body, []byte(`"keep":"kept"`)) || bytes.Contains(body, []byte(b64[:100])) {
		t.Fatal("the published history must hold the image by ref, never its base64")
	}
	resp, body = g.do(t, "GET", "/v1/sessions/"+id+"/keepimg", "k", nil)
	k := decodeJSON(t, body)
	if resp.StatusCode != 200 || k["vision_enabled"] != true || k["engine_sees_images"] != true || k["budget"].(float64) != 12800 || k["used"].(float64) != float64(cost) {
		t.Fatalf("keepimg %v", k)
	}
	resp, body = g.do(t, "GET", "/v1/sessions/"+id+"/export", "k", nil)
	lines := 0
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines++
	}
	if resp.StatusCode != 200 || lines != 1+4+1 || !strings.HasPrefix(string(body), `{"type":"session"`) {
		t.Fatalf("export: %d lines\n%s", lines, body)
	}
	// Another tenant cannot see it; delete works once.
	if resp, _ := g.do(t, "GET", "/v1/sessions/"+id, "", nil); resp.StatusCode != 401 {
		t.Fatalf("no key: %d", resp.StatusCode)
	}
	if resp, _ := g.do(t, "DELETE", "/v1/sessions/"+id, "k", nil); resp.StatusCode != 204 {
		t.Fatalf("delete: %d", resp.StatusCode)
	}
	if resp, _ := g.do(t, "GET", "/v1/sessions/"+id, "k", nil); resp.StatusCode != 404 {
		t.Fatalf("after delete: %d", resp.StatusCode)
	}
	// A turn that does not fit: tool results with no open turn.
	id2 := g.newSession(t, "k", `{"model":"gpt-4o"}`)
	if resp, body := g.do(t, "POST", "/v1/sessions/"+id2+"/turn", "k", []byte(`{"messages":[{"role":"tool","tool_call_id":"x","content":"?"}]}`)); resp.StatusCode != 409 {
		t.Fatalf("bad turn: %d %s", resp.StatusCode, body)
	}
}

// Seed keep-turn-images.md, facade_keepimg_test.go: state, store read back
// byte-exact, refusals, unreadable body, wrong method.
func TestKeepimgStore(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	id := g.newSession(t, "", `{"model":"gpt-4o"}`)
	path := "/v1/sessions/" + id + "/keepimg/store"
	raw, b64 := samplePNG(t)
	msg := func(parts string) []byte {
		return []byte(`{"message":{"role":"tool","tool_call_id":"c","content":[` + parts + `]}}`)
	}
	img := func(url string) string { return `{"type":"image_url","image_url":{"url":"` + url + `"}}` }

	resp, body := g.do(t, "POST", path, "", msg(`{"type":"text","text":"shot"},{"type":"image_url","caption":"the login form","image_url":{"url":"data:image/png;base64,`+b64+`"}}`))
	r := decodeJSON(t, body)
	if r["caption"] != "the login form" || bytes.Contains(body, []byte(`"caption":"the login form"}`+"]")) {
		t.Fatalf("the explicit caption: %v", r["caption"])
	}
	if resp.StatusCode != 200 || r["bytes"].(float64) != float64(len(raw)) || !strings.Contains(string(body), `"url":"imgctx:sha256-`) {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	// Stored and read back byte-exact.
	resp, got := g.do(t, "GET", "/v1/images/"+r["ref"].(string), "", nil)
	if resp.StatusCode != 200 || !bytes.Equal(got, raw) || resp.Header.Get("Content-Type") != "image/png" {
		t.Fatal("the stored image does not read back byte-exact")
	}
	cases := []struct {
		name   string
		body   []byte
		status int
		why    string
	}{
		{"text only", msg(`{"type":"text","text":"no image"}`), 422, "text_only"},
		{"remote URL", msg(img("https://example.com/a.png")), 422, "remote_url"},
		{"unknown format", msg(img("data:image/png;base64,aGVsbG8gdGhlcmU=")), 415, "unknown_format"},
		{"unreadable base64", msg(img("data:image/png;base64,@@@@")), 400, "unreadable_base64"},
		{"two images", msg(img("data:image/png;base64,"+b64) + "," + img("data:image/png;base64,"+b64)), 422, "two_images"},
		{"five-character URL", msg(img("data:")), 400, "unreadable_base64"},
		{"a PDF sent as an image", msg(img("data:image/png;base64,JVBERi0xLjQKJSVFT0YK")), 415, "not_an_image"},
		{"malformed ref", msg(img("imgctx:sha256-nothex")), 400, "bad_ref"},
		{"unknown ref", msg(img("imgctx:sha256-" + strings.Repeat("ab", 32))), 404, "unknown_ref"},
		{"file URL", msg(img("file:///etc/passwd")), 422, "unsupported_url"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := g.do(t, "POST", path, "", c.body)
			if resp.StatusCode != c.status || !bytes.Contains(body, []byte(`"refused":"`+c.why+`"`)) {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
		})
	}
	if resp, _ := g.do(t, "POST", path, "", []byte(`not json`)); resp.StatusCode != 400 {
		t.Fatalf("unreadable body: %d", resp.StatusCode)
	}
	if resp, _ := g.do(t, "GET", path, "", nil); resp.StatusCode != 405 {
		t.Fatalf("GET on store: %d", resp.StatusCode)
	}
	if n := g.stored(t, "default"); n != 1 {
		t.Fatalf("%d images stored; refusals must store nothing", n)
	}
	// Where nothing can be kept (a sub-agent's thread, the switch off),
	// there is no budget to report.
	for _, create := range []string{`{"model":"gpt-4o","thread":"sub"}`, `{"model":"gpt-4o","keep_turn_images":false}`} {
		_, body := g.do(t, "POST", "/v1/sessions", "", []byte(create))
		_, body = g.do(t, "GET", "/v1/sessions/"+decodeJSON(t, body)["id"].(string)+"/keepimg", "", nil)
		if k := decodeJSON(t, body); k["budget"].(float64) != 0 || k["available"].(float64) != 0 {
			t.Fatalf("%s: keepimg %v", create, k)
		}
	}
}

// Cross-format: a turn decoded from OpenAI JSON and run on an Anthropic
// upstream carries only fields valid there — no message name, no part
// extras, no OpenAI audio part — and its PDF travels as a native document
// block, byte-exact from the store.
func TestSessionsAPICrossFormatCarriesOnlyTheUpstreamsFields(t *testing.T) {
	g := newGW(t, upstream.Anthropic, nil)
	id := g.newSession(t, "", `{"model":"claude-sonnet-4-6"}`)
	const pdf = "JVBERi0xLjQKMSAwIG9iajw8L1R5cGUvQ2F0YWxvZy9QYWdlcyAyIDAgUj4+ZW5kb2JqCjIgMCBvYmo8PC9UeXBlL1BhZ2VzL0tpZHNbMyAwIFJdL0NvdW50IDE+PmVuZG9iagozIDAgb2JqPDwvVHlwZS9QYWdlL1BhcmVudCAyIDAgUi9NZWRpYUJveFswIDAgNjEyIDc5Ml0+PmVuZG9iagp0cmFpbGVyPDwvUm9vdCAxIDAgUj4+CiUlRU9GCg=="
	turn := `{"messages":[{"role":"user","name":"alice","content":[` +
		`{"type":"text","text":"Summarise <this> & that.","x_vendor":{"a":1}},` +
		`{"type":"file","file":{"filename":"spec.pdf","file_data":"data:application/pdf;base64,` + pdf + `"}},` +
		`{"type":"input_audio","input_audio":{"data":"UklGRiQAAABXQVZF","format":"wav"}}]}]}`
	resp, body := g.do(t, "POST", "/v1/sessions/"+id+"/turn", "", []byte(turn))
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	sent := string(g.up.received()[0])
	for _, gone := range []string{`"name"`, "x_vendor", "input_audio", "alice"} {
		if strings.Contains(sent, gone) {
			t.Errorf("the Anthropic upstream got %s:\n%s", gone, sent)
		}
	}
	want := `{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"` + pdf + `"},"title":"spec.pdf"`
	if !strings.Contains(sent, want) || !strings.Contains(sent, `"text":"Summarise <this> & that."`) {
		t.Fatalf("the upstream body lacks the native document or the text as written:\n%s", sent)
	}
}

// The switch turned off mid-session (seed: "clé retirée: l'image part au
// début du tour suivant, légende et marque gardées"): the open turn goes
// on as it began, its screenshot kept; the next turn starts without it.
func TestPatchTurnsKeepingOffAtTheNextTurn(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	g.up.toolCalls = []string{"screenshot"}
	id := g.newSession(t, "", `{"model":"gpt-4o","keep_turn_images":true}`)
	g.do(t, "POST", "/v1/sessions/"+id+"/turn", "", []byte(`{"messages":[{"role":"user","content":"Open the login page."}]}`))
	resp, body := g.do(t, "PATCH", "/v1/sessions/"+id, "", []byte(`{"keep_turn_images":false}`))
	if resp.StatusCode != 200 || decodeJSON(t, body)["keep_turn_images"] != false {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	_, b64 := samplePNG(t)
	tool := fmt.Sprintf(`{"messages":[{"role":"tool","tool_call_id":"call_1","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,%s"}}]}]}`, b64)
	_, body = g.do(t, "POST", "/v1/sessions/"+id+"/turn", "", []byte(tool))
	if !bytes.Contains(body, []byte(`"kind":"kept"`)) {
		t.Fatalf("the open turn did not go on as it began: %s", body)
	}
	_, body = g.do(t, "POST", "/v1/sessions/"+id+"/turn", "", []byte(`{"messages":[{"role":"user","content":"And now?"}]}`))
	got := g.up.received()
	last := got[len(got)-1]
	if countImages(last) != 0 || !bytes.Contains(last, []byte("[image removed — screenshot {}]")) || !bytes.Contains(body, []byte(`"reason":"key_off"`)) {
		t.Fatalf("the next turn still carries the kept image: %d images", countImages(last))
	}
	for _, bad := range []string{`{"keep_turn_images":"no"}`, `{"colour":"blue"}`, `{"model":""}`, `not json`} {
		if resp, _ := g.do(t, "PATCH", "/v1/sessions/"+id, "", []byte(bad)); resp.StatusCode != 400 {
			t.Errorf("%s: %d", bad, resp.StatusCode)
		}
	}
	if resp, _ := g.do(t, "PATCH", "/v1/sessions/s_000000000000000000000000", "", []byte(`{"keep_turn_images":true}`)); resp.StatusCode != 404 {
		t.Errorf("unknown session: %d", resp.StatusCode)
	}
}

// PATCH moves a session to another model: the next turn asks it, the
// history unchanged, and the session says so.
func TestPatchMovesTheSessionToAnotherModel(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	id := g.newSession(t, "", `{"model":"gpt-4o"}`)
	g.do(t, "POST", "/v1/sessions/"+id+"/turn", "", []byte(`{"messages":[{"role":"user","content":"Hello."}]}`))
	resp, body := g.do(t, "PATCH", "/v1/sessions/"+id, "", []byte(`{"model":"gpt-4o-mini"}`))
	if resp.StatusCode != 200 || decodeJSON(t, body)["model"] != "gpt-4o-mini" || decodeJSON(t, body)["keep_turn_images"] != true {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	g.do(t, "POST", "/v1/sessions/"+id+"/turn", "", []byte(`{"messages":[{"role":"user","content":"Again."}]}`))
	got := g.up.received()
	if len(got) != 2 || !bytes.Contains(got[0], []byte(`"model":"gpt-4o"`)) || !bytes.Contains(got[1], []byte(`"model":"gpt-4o-mini"`)) ||
		!bytes.Contains(got[1], []byte(`"content":"Hello."`)) {
		t.Fatalf("the turns asked:\n%s\n%s", got[0], got[1])
	}
	if _, body := g.do(t, "GET", "/v1/sessions/"+id, "", nil); !bytes.Contains(body, []byte(`"model":"gpt-4o-mini"`)) {
		t.Fatalf("the session after the move: %s", body)
	}
}

// An image over the budget is decided ephemeral mid-turn and removed at
// the turn's end: one decision each in the metrics, one removal.
func TestSessionsCountARemovalOnce(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	g.up.toolCalls = []string{"screenshot", "screenshot", "screenshot"}
	id := g.newSession(t, "", `{"model":"tiny-vl"}`)
	g.do(t, "POST", "/v1/sessions/"+id+"/turn", "", []byte(`{"messages":[{"role":"user","content":"Go."}]}`))
	raw, _ := samplePNG(t)
	for i := range 3 {
		tool := fmt.Sprintf(`{"messages":[{"role":"tool","tool_call_id":"call_1","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,%s"}}]}]}`,
			base64.StdEncoding.EncodeToString(distinctPNG(raw, i)))
		if resp, body := g.do(t, "POST", "/v1/sessions/"+id+"/turn", "", []byte(tool)); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
	}
	m := metric(t, g, "imgctx_images_total")
	if !strings.Contains(m, `event="removed",reason="budget"} 1`) || !strings.Contains(m, `event="ephemeral",reason="budget"} 1`) || !strings.Contains(m, `event="kept",reason=""} 2`) {
		t.Fatalf("metrics:\n%s", m)
	}
}

// A sessions turn retried with its Idempotency-Key gets its first answer
// again — from this replica or another one over the same store — and the
// model is not called twice; the key with other messages is a 422.
func TestSessionsIdempotencyKey(t *testing.T) {
	g := newGW(t, upstream.OpenAI, map[string]string{"k": "acme"})
	id := g.newSession(t, "k", `{"model":"gpt-4o"}`)
	turn := []byte(`{"messages":[{"role":"user","content":"Open the login page."}]}`)
	resp, first := g.do(t, "POST", "/v1/sessions/"+id+"/turn", "k", turn, "Idempotency-Key", "turn-1")
	if resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("%d %s", resp.StatusCode, first)
	}
	calls := len(g.up.received())
	resp, again := g.do(t, "POST", "/v1/sessions/"+id+"/turn", "k", turn, "Idempotency-Key", "turn-1")
	if resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "true" || len(g.up.received()) != calls {
		t.Fatalf("retry: %d, replayed %q, %d upstream calls (was %d): %s", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), len(g.up.received()), calls, again)
	}
	if a, b := decodeJSON(t, first), decodeJSON(t, again); fmt.Sprint(a["message"]) != fmt.Sprint(b["message"]) || fmt.Sprint(a["usage"]) != fmt.Sprint(b["usage"]) {
		t.Fatalf("the retry's answer differs:\n%s\n%s", first, again)
	}
	// Another replica over the same session store finds the key too.
	other := &engine.Engine{Images: g.engine.Images, Sessions: g.engine.Sessions, Profiles: g.engine.Profiles, Upstream: g.engine.Upstream}
	srv := httptest.NewServer(New(Config{Keys: map[string]string{"k": "acme"}}, other, prometheus.NewRegistry(), discardLogger()).Handler())
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/v1/sessions/"+id+"/turn", bytes.NewReader(turn))
	req.Header.Set("Authorization", "Bearer k")
	req.Header.Set("Idempotency-Key", "turn-1")
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r2.Body.Close()
	if r2.StatusCode != 200 || r2.Header.Get("Idempotent-Replayed") != "true" || len(g.up.received()) != calls {
		t.Fatalf("on another replica: %d, replayed %q, %d upstream calls", r2.StatusCode, r2.Header.Get("Idempotent-Replayed"), len(g.up.received()))
	}
	// The same key with other messages is refused; the log has one turn.
	if resp, b := g.do(t, "POST", "/v1/sessions/"+id+"/turn", "k", []byte(`{"messages":[{"role":"user","content":"Something else."}]}`), "Idempotency-Key", "turn-1"); resp.StatusCode != 422 || !strings.Contains(string(b), "Idempotency-Key") {
		t.Fatalf("a reused key: %d %s", resp.StatusCode, b)
	}
	snap, _ := g.engine.Sessions.Load(t.Context(), "acme", session.ID(id))
	if len(snap.Log) != 2 {
		t.Fatalf("%d log entries, want the turn's 2 (user, assistant)", len(snap.Log))
	}
	// A new key is a new turn.
	if resp, b := g.do(t, "POST", "/v1/sessions/"+id+"/turn", "k", []byte(`{"messages":[{"role":"user","content":"Something else."}]}`), "Idempotency-Key", "turn-2"); resp.StatusCode != 200 || len(g.up.received()) != calls+1 {
		t.Fatalf("a new key: %d %s", resp.StatusCode, b)
	}
}

// The sessions API refuses what it cannot act on with a clear error in
// OpenAI's shape and the right status, and creates or changes nothing: a
// session without a model or with an unknown thread kind, a malformed
// turn, a PDF in an image part, a keepimg store of no readable message,
// and every route on a session that does not exist.
func TestSessionsAPIRefusals(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	id := g.newSession(t, "", `{"model":"gpt-4o"}`)
	const none = "s_000000000000000000000000"
	for _, c := range []struct {
		method, path, body string
		status             int
		says               string
	}{
		{"POST", "/v1/sessions", `{}`, 400, `body must be {\"model\"`},
		{"POST", "/v1/sessions", `{"model":`, 400, `body must be {\"model\"`},
		{"POST", "/v1/sessions", `{"model":"gpt-4o","thread":"side"}`, 400, `thread must be \"main\" or \"sub\"`},
		{"POST", "/v1/sessions/" + id + "/turn", `{"messages":`, 400, "malformed turn"},
		{"POST", "/v1/sessions/" + id + "/turn", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` +
			base64.StdEncoding.EncodeToString([]byte("%PDF-1.7\n%%EOF\n")) + `"}}]}]}`, 400, "application/pdf sent as an image"},
		{"POST", "/v1/sessions/" + id + "/keepimg/store", `{}`, 400, `body must be {\"message\"`},
		{"POST", "/v1/sessions/" + id + "/keepimg/store", `{"message":{"role":"tool","content":[{"type":"image_url"}]}}`, 400, "unreadable message"},
		{"POST", "/v1/sessions/" + none + "/turn", `{"messages":[{"role":"user","content":"hi"}]}`, 404, ""},
		{"GET", "/v1/sessions/" + none, ``, 404, ""},
		{"DELETE", "/v1/sessions/" + none, ``, 404, ""},
		{"GET", "/v1/sessions/" + none + "/export", ``, 404, ""},
		{"GET", "/v1/sessions/" + none + "/keepimg", ``, 404, ""},
		{"POST", "/v1/sessions/" + none + "/keepimg/store", `{"message":{"role":"tool","content":"x"}}`, 404, ""},
	} {
		resp, body := g.do(t, c.method, c.path, "", []byte(c.body))
		var e struct {
			Error struct{ Message, Type string }
		}
		if resp.StatusCode != c.status || json.Unmarshal(body, &e) != nil || e.Error.Message == "" || !strings.Contains(string(body), c.says) {
			t.Errorf("%s %s %s: %d %s; want %d in OpenAI's error shape saying %q", c.method, c.path, c.body, resp.StatusCode, body, c.status, c.says)
		}
	}
	list, err := g.engine.Sessions.List(t.Context(), "default")
	if err != nil || len(list) != 1 {
		t.Fatalf("sessions after the refusals: %d (%v), want the one made", len(list), err)
	}
	if len(g.up.received()) != 0 {
		t.Fatalf("a refused turn reached the upstream: %s", g.up.received()[0])
	}
	if n := g.stored(t, "default"); n != 0 {
		t.Fatalf("the refused turns stored %d blobs", n)
	}
}

// A turn the model cannot take even with the older images removed and the
// history compacted answers 400 context_length_exceeded, saying what was
// tried and the provider's words, and leaves the session as it was.
func TestSessionsAPIContextFullLeavesTheSession(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	g.up.maxImages = 1 // prompt too long past one image
	raw, _ := samplePNG(t)
	img := func(n int) string {
		return `{"type":"image_url","image_url":{"url":"data:image/png;base64,` + base64.StdEncoding.EncodeToString(distinctPNG(raw, n)) + `"}}`
	}
	id := g.newSession(t, "", `{"model":"gpt-4o"}`)
	if resp, body := g.do(t, "POST", "/v1/sessions/"+id+"/turn", "", []byte(`{"messages":[{"role":"user","content":[`+img(1)+`]}]}`)); resp.StatusCode != 200 {
		t.Fatalf("first turn: %d %s", resp.StatusCode, body)
	}
	_, before := g.do(t, "GET", "/v1/sessions/"+id, "", nil)
	resp, body := g.do(t, "POST", "/v1/sessions/"+id+"/turn", "", []byte(`{"messages":[{"role":"user","content":[`+img(2)+`,`+img(3)+`]}]}`))
	var e struct {
		Error struct{ Type, Message string }
	}
	if resp.StatusCode != 400 || json.Unmarshal(body, &e) != nil || e.Error.Type != "context_length_exceeded" ||
		!strings.Contains(e.Error.Message, "even after removing images and compacting") || !strings.Contains(e.Error.Message, "maximum context length") {
		t.Fatalf("%d %s; want 400 context_length_exceeded with what was tried and the provider's words", resp.StatusCode, body)
	}
	if _, after := g.do(t, "GET", "/v1/sessions/"+id, "", nil); !bytes.Equal(before, after) {
		t.Fatalf("the refused turn changed the session:\nbefore %s\nafter  %s", before, after)
	}
}
