package gateway

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire/wiretest"
	"github.com/prometheus/client_golang/prometheus"
)

// Seed replayed-history-images (003) end to end, through the flat codecs:
//
//	an image from turn 1 of a 3-turn history is carried    TestFlatCarriesAnImageFromTurnOne
//	the current image stays #1, history numbered after     TestFlatKeepsTheCurrentImageFirst
//	bounds newest-first, the drop counted                  TestFlatBoundsNewestFirst
//	0 opts out and still counts                            TestFlatZeroOptsOutAndCounts
//	a turn dropped by the history budget is truncated      TestFlatTruncatedTurnIsCounted
//	a rebuilt request carries what a fresh one does, once  TestFlatRebuiltRequestIsTheSame
//	no vision: nothing attached, counted no_vision         TestFlatWithoutVisionAttachesNothing
//	the count cap and the byte cap each hold alone         TestFlatCapsHoldOnTheirOwn
//	Ollama, an Anthropic client, streamed                  TestFlatOllamaForAnAnthropicClient

// flatUpstream is a llama.cpp server or an Ollama built from their docs:
// llama.cpp's GET /props names its media marker and POST /completion takes
// {"prompt": {"prompt_string", "multimodal_data": [base64…]}} with one
// marker per image (it refuses a mismatch); Ollama's POST /api/generate
// takes {"model", "prompt", "images": [base64…]}.
type flatUpstream struct {
	format upstream.Format
	srv    *httptest.Server
	mu     sync.Mutex
	bodies [][]byte
	images [][]string // the images of each request, as sent
	prompt []string
}

const testMarker = "<__media_Qx7v__>"

func newFlatUpstream(t *testing.T, format upstream.Format) *flatUpstream {
	f := &flatUpstream{format: format}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodGet && r.URL.Path == "/props" && format == upstream.LlamaCpp {
			fmt.Fprintf(w, `{"media_marker":%q,"modalities":{"vision":true},"total_slots":1}`, testMarker)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var prompt string
		var images []string
		switch {
		case format == upstream.LlamaCpp && r.URL.Path == "/completion":
			var req struct {
				Prompt json.RawMessage `json:"prompt"`
			}
			json.Unmarshal(body, &req)
			var mm struct {
				PromptString   string   `json:"prompt_string"`
				MultimodalData []string `json:"multimodal_data"`
			}
			if json.Unmarshal(req.Prompt, &prompt) != nil {
				if err := json.Unmarshal(req.Prompt, &mm); err != nil {
					t.Errorf("llama.cpp: a prompt off the documented shape: %s", req.Prompt)
				}
				prompt, images = mm.PromptString, mm.MultimodalData
			}
			if n := strings.Count(prompt, testMarker); n != len(images) {
				w.WriteHeader(400)
				fmt.Fprintf(w, `{"error":{"code":400,"message":"number of bitmaps (%d) does not match number of markers (%d)","type":"invalid_request_error"}}`, len(images), n)
				return
			}
			fmt.Fprintf(w, `{"content":"Done.","stop":true,"stop_type":"eos","tokens_evaluated":%d,"tokens_predicted":3,"truncated":false}`, len(prompt)/4)
		case format == upstream.Ollama && r.URL.Path == "/api/generate":
			var req struct {
				Model  string   `json:"model"`
				Prompt string   `json:"prompt"`
				Images []string `json:"images"`
			}
			json.Unmarshal(body, &req)
			prompt, images = req.Prompt, req.Images
			fmt.Fprintf(w, `{"model":%q,"created_at":"2026-12-01T10:00:00Z","response":"Done.","done":true,"done_reason":"stop","prompt_eval_count":%d,"eval_count":3}`, req.Model, len(prompt)/4)
		default:
			t.Errorf("%s: unexpected %s %s", format, r.Method, r.URL.Path)
			w.WriteHeader(404)
			return
		}
		f.mu.Lock()
		f.bodies, f.images, f.prompt = append(f.bodies, body), append(f.images, images), append(f.prompt, prompt)
		f.mu.Unlock()
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *flatUpstream) last() (prompt string, images []string, body []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.bodies) - 1
	return f.prompt[n], f.images[n], f.bodies[n]
}

type flatRig struct {
	up    *flatUpstream
	url   string
	reg   *prometheus.Registry
	png   []byte
	serve func(Config)
}

func newFlatRig(t *testing.T, format upstream.Format, replay *policy.ReplayConfig, vision *bool) *flatRig {
	r := &flatRig{up: newFlatUpstream(t, format)}
	r.png, _ = samplePNG(t)
	tbl, _ := tokens.Default().With(agentProfile(200_000))
	e := &engine.Engine{Images: imagestore.Verified{Store: &imagestore.Mem{}}, Sessions: &session.Mem{}, Profiles: tbl}
	e.Replay = replay
	// URL images are fetched from loopback servers of the test only.
	e.Fetcher = &media.Fetcher{Timeout: 2 * time.Second, AllowLoopback: true, AnyPort: true, Log: discardLogger()}
	ups := []*Upstream{{Name: "local", Client: &upstream.Client{Format: format, BaseURL: r.up.srv.URL, MaxRetries: -1}, Hints: engine.Hints{Vision: vision}}}
	r.serve = func(cfg Config) {
		cfg.MaxBodyBytes, cfg.Upstreams = 64<<20, ups
		r.reg = prometheus.NewRegistry()
		s := New(cfg, e, r.reg, discardLogger())
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(srv.Close)
		t.Cleanup(s.Close)
		r.url = srv.URL
	}
	r.serve(Config{})
	return r
}

// recall serves the rig again with recall on.
func (r *flatRig) recall(*testing.T) { r.serve(Config{Recall: true}) }

func (r *flatRig) shot(n int) string { return base64.StdEncoding.EncodeToString(distinctPNG(r.png, n)) }

func (r *flatRig) count(event, code string) int {
	return (&agentRig{reg: r.reg}).counter(event, code)
}

// chat sends an OpenAI chat body with msgs (JSON messages) and returns the
// answer.
func (r *flatRig) chat(t *testing.T, msgs ...string) []byte {
	t.Helper()
	body := `{"model":"agent-1","messages":[` + strings.Join(msgs, ",") + `]}`
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	return b
}

func userImage(text, b64 string) string {
	return fmt.Sprintf(`{"role":"user","content":[{"type":"text","text":%q},{"type":"image_url","image_url":{"url":"data:image/png;base64,%s"}}]}`, text, b64)
}

func say(role, text string) string { return fmt.Sprintf(`{"role":%q,"content":%q}`, role, text) }

func TestFlatCarriesAnImageFromTurnOne(t *testing.T) {
	r := newFlatRig(t, upstream.LlamaCpp, nil, nil)
	a := r.shot(1)
	answer := r.chat(t, say("system", "You see images."), userImage("What is this?", a), say("assistant", "A login form."),
		say("user", "And the colour?"), say("assistant", "Blue."), say("user", "Remind me what the first screen was."))
	prompt, images, _ := r.up.last()
	if len(images) != 1 || images[0] != a || !strings.Contains(prompt, "[Image #1 attached to this request — from an earlier turn]") {
		t.Fatalf("%d images; prompt %q", len(images), prompt)
	}
	if !strings.HasPrefix(prompt, "System: You see images.") || strings.Count(prompt, testMarker) != 1 || !strings.Contains(prompt, "Remind me") {
		t.Fatalf("prompt %q", prompt)
	}
	var c struct {
		Choices []struct{ Message struct{ Content string } }
	}
	if json.Unmarshal(answer, &c); c.Choices[0].Message.Content != "Done." {
		t.Fatalf("answer %s", answer)
	}
}

func TestFlatKeepsTheCurrentImageFirst(t *testing.T) {
	r := newFlatRig(t, upstream.LlamaCpp, nil, nil)
	a, b := r.shot(1), r.shot(2)
	r.chat(t, userImage("First.", a), say("assistant", "Seen."), userImage("And this one?", b))
	prompt, images, _ := r.up.last()
	if len(images) != 2 || images[0] != b || images[1] != a {
		t.Fatal("the current image is not #1 with the history image after it")
	}
	if !strings.Contains(prompt, "[Image #2 attached to this request — from an earlier turn]") || !strings.Contains(prompt, "[Attached images: #1 "+testMarker+" #2 "+testMarker+"]") {
		t.Fatalf("prompt %q", prompt)
	}
}

// history builds n turns, each with its own image, and a last question.
func (r *flatRig) history(n int) []string {
	var msgs []string
	for i := range n {
		msgs = append(msgs, userImage(fmt.Sprintf("Screen %d.", i), r.shot(i+1)), say("assistant", "Seen."))
	}
	return append(msgs, say("user", "Which screens did you see?"))
}

func TestFlatBoundsNewestFirst(t *testing.T) {
	r := newFlatRig(t, upstream.LlamaCpp, nil, nil)
	r.chat(t, r.history(6)...)
	_, images, _ := r.up.last()
	want := []string{r.shot(3), r.shot(4), r.shot(5), r.shot(6)} // the newest four, in order
	if fmt.Sprint(images) != fmt.Sprint(want) || r.count("not_sent", "cap") != 2 {
		t.Fatalf("%d images attached, %d counted cap", len(images), r.count("not_sent", "cap"))
	}
}

func TestFlatZeroOptsOutAndCounts(t *testing.T) {
	r := newFlatRig(t, upstream.Ollama, &policy.ReplayConfig{MaxHistoryImages: 0, MaxHistoryImageBytes: 1 << 20}, nil)
	r.chat(t, r.history(3)...)
	prompt, images, _ := r.up.last()
	if len(images) != 0 || r.count("not_sent", "cap") != 3 || !strings.Contains(prompt, "(cap)]") {
		t.Fatalf("%d images; %d counted", len(images), r.count("not_sent", "cap"))
	}
}

func TestFlatTruncatedTurnIsCounted(t *testing.T) {
	r := newFlatRig(t, upstream.LlamaCpp, &policy.ReplayConfig{MaxHistoryImages: 4, MaxHistoryImageBytes: 1 << 20, MaxHistoryChars: 40}, nil)
	msgs := []string{userImage("An old screen, with a long description of what was on it.", r.shot(1)), say("assistant", "Seen."),
		userImage("New.", r.shot(2)), say("assistant", "Ok."), say("user", "Now?")}
	r.chat(t, msgs...)
	prompt, images, _ := r.up.last()
	if len(images) != 1 || images[0] != r.shot(2) || r.count("not_sent", "truncated") != 1 || !strings.Contains(prompt, "earlier turn(s) omitted") {
		t.Fatalf("%d images, %d truncated; prompt %q", len(images), r.count("not_sent", "truncated"), prompt)
	}
}

func TestFlatRebuiltRequestIsTheSame(t *testing.T) {
	r := newFlatRig(t, upstream.LlamaCpp, nil, nil)
	msgs := r.history(6)
	r.chat(t, msgs...)
	_, _, first := r.up.last()
	r.chat(t, msgs...)
	_, _, second := r.up.last()
	if !bytes.Equal(first, second) || r.count("not_sent", "cap") != 4 || r.count("sent", "") != 8 {
		t.Fatalf("rebuilt request differs (%v), or counted %d cap / %d sent over two requests", !bytes.Equal(first, second), r.count("not_sent", "cap"), r.count("sent", ""))
	}
}

func TestFlatWithoutVisionAttachesNothing(t *testing.T) {
	off := false
	r := newFlatRig(t, upstream.LlamaCpp, nil, &off)
	r.chat(t, userImage("Old.", r.shot(1)), say("assistant", "Seen."), userImage("Now this.", r.shot(2)))
	prompt, images, body := r.up.last()
	if len(images) != 0 || bytes.Contains(body, []byte("multimodal_data")) || strings.Contains(prompt, testMarker) || r.count("not_sent", "no_vision") != 2 {
		t.Fatalf("%d images, %d no_vision", len(images), r.count("not_sent", "no_vision"))
	}
	// Both are named in the prompt where they stood: the history's in its
	// turn, the current one beside the message's text.
	if n := strings.Count(prompt, "(no_vision)]"); n != 2 || !strings.Contains(prompt, "User: [Image not attached: image/png (no_vision)] Now this.") {
		t.Fatalf("%d images named in the prompt:\n%s", n, prompt)
	}
}

func TestFlatCapsHoldOnTheirOwn(t *testing.T) {
	size := int64(len(distinctPNG(newFlatRig(t, upstream.LlamaCpp, nil, nil).png, 1)))
	count := newFlatRig(t, upstream.LlamaCpp, &policy.ReplayConfig{MaxHistoryImages: 2, MaxHistoryImageBytes: 1 << 30}, nil)
	count.chat(t, count.history(5)...)
	if _, images, _ := count.up.last(); len(images) != 2 || count.count("not_sent", "cap") != 3 || count.count("not_sent", "bytes") != 0 {
		t.Fatalf("count cap: %d attached", len(images))
	}
	bytesCap := newFlatRig(t, upstream.LlamaCpp, &policy.ReplayConfig{MaxHistoryImages: 100, MaxHistoryImageBytes: 3*size + size/2}, nil)
	bytesCap.chat(t, bytesCap.history(5)...)
	if _, images, _ := bytesCap.up.last(); len(images) != 3 || bytesCap.count("not_sent", "bytes") != 2 || bytesCap.count("not_sent", "cap") != 0 {
		t.Fatalf("byte cap: %d attached, %d bytes", len(images), bytesCap.count("not_sent", "bytes"))
	}
}

// An Anthropic client on an Ollama backend, streamed: the answer comes
// back as Anthropic events; the images go in order.
func TestFlatOllamaForAnAnthropicClient(t *testing.T) {
	r := newFlatRig(t, upstream.Ollama, nil, nil)
	a, b := r.shot(1), r.shot(2)
	img := func(data string) string {
		return `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + data + `"}}`
	}
	body := `{"model":"agent-1","max_tokens":64,"stream":true,"system":"You see images.","messages":[` +
		`{"role":"user","content":[{"type":"text","text":"First."},` + img(a) + `]},{"role":"assistant","content":"Seen."},` +
		`{"role":"user","content":[{"type":"text","text":"And this?"},` + img(b) + `]}]}`
	resp, err := http.Post(r.url+"/v1/messages", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") ||
		!bytes.Contains(out, []byte(`"text":"Done."`)) || !bytes.Contains(out, []byte("event: message_stop")) {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	prompt, images, _ := r.up.last()
	if len(images) != 2 || images[0] != b || images[1] != a || !strings.HasPrefix(prompt, "System: You see images.") {
		t.Fatalf("%d images; prompt %q", len(images), prompt)
	}
}

// A flat backend has no token-count endpoint: count_tokens is answered
// from imgctx's estimate of the request it would send, and says so.
func TestFlatCountTokensIsEstimated(t *testing.T) {
	r := newFlatRig(t, upstream.Ollama, nil, nil)
	body := `{"model":"agent-1","messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + r.shot(1) + `"}}]}]}`
	resp, err := http.Post(r.url+"/v1/messages/count_tokens", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var c struct {
		InputTokens int `json:"input_tokens"`
	}
	json.Unmarshal(out, &c)
	if resp.StatusCode != 200 || resp.Header.Get("X-Imgctx-Token-Count") != "estimated" || c.InputTokens < 1334 || len(r.up.bodies) != 0 {
		t.Fatalf("%d %s %q; %d upstream requests", resp.StatusCode, out, resp.Header.Get("X-Imgctx-Token-Count"), len(r.up.bodies))
	}
}

// The requests the flat codecs write, pinned: llama.cpp's and Ollama's
// bodies for one history (a system prompt, an image two turns back, a
// current image), images shortened to their first bytes.
func TestFlatRequestsGolden(t *testing.T) {
	var pinned [][]byte
	for _, format := range []upstream.Format{upstream.LlamaCpp, upstream.Ollama} {
		r := newFlatRig(t, format, nil, nil)
		r.chat(t, say("system", "You see images."), userImage("The first screen.", r.shot(1)), say("assistant", "A login form."),
			say("user", "And then?"), say("assistant", "I clicked."), userImage("This one now.", r.shot(2)))
		_, _, body := r.up.last()
		for _, n := range []int{1, 2} {
			body = bytes.ReplaceAll(body, []byte(r.shot(n)), []byte(fmt.Sprintf("<screenshot %d: %d base64 characters>", n, len(r.shot(n)))))
		}
		pinned = append(pinned, bytes.TrimSpace(body))
	}
	// One body a line, as sent (no escaping of <, > or &).
	wiretest.Golden(t, "testdata/flat-requests.golden", append(bytes.Join(pinned, []byte("\n")), '\n'))
}

// A streaming OpenAI client on a flat backend gets chat.completion.chunk
// events and [DONE]; a Responses client is told the backend serves the
// chat routes only.
func TestFlatStreamsToAnOpenAIClientAndRefusesResponses(t *testing.T) {
	r := newFlatRig(t, upstream.Ollama, nil, nil)
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"agent-1","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(out, []byte(`"object":"chat.completion.chunk"`)) || !bytes.Contains(out, []byte(`"content":"Done."`)) || !bytes.HasSuffix(bytes.TrimSpace(out), []byte("data: [DONE]")) {
		t.Fatalf("%s", out)
	}
	resp, err = http.Post(r.url+"/v1/responses", "application/json", strings.NewReader(`{"model":"agent-1","input":"hi"}`))
	if err != nil {
		t.Fatal(err)
	}
	out, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !bytes.Contains(out, []byte("serves the chat and messages routes only")) {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
}

// Issue "Hardening, third pass", item 4: the current message's image by
// http(s) URL is fetched (through the SSRF guard) and attached; one that
// cannot be fetched is named in the prompt and counted fetch_failed, the
// request answered — never a 500.
func TestFlatFetchesTheCurrentImageByURL(t *testing.T) {
	r := newFlatRig(t, upstream.LlamaCpp, nil, nil)
	png := distinctPNG(r.png, 7)
	files := imageSite(t, "/shot.png", png)
	byURL := func(text, url string) string {
		return fmt.Sprintf(`{"role":"user","content":[{"type":"text","text":%q},{"type":"image_url","image_url":{"url":%q}}]}`, text, url)
	}
	r.chat(t, byURL("What is this?", files.URL+"/shot.png"))
	prompt, images, _ := r.up.last()
	if len(images) != 1 || images[0] != base64.StdEncoding.EncodeToString(png) || !strings.Contains(prompt, "#1") {
		t.Fatalf("%d images; the fetched one not attached:\n%s", len(images), prompt)
	}
	r.chat(t, byURL("And this?", files.URL+"/gone.png"))
	prompt, images, _ = r.up.last()
	if len(images) != 0 || !strings.Contains(prompt, "(fetch_failed)]") || r.count("not_sent", "fetch_failed") != 1 {
		t.Fatalf("%d images, %d fetch_failed:\n%s", len(images), r.count("not_sent", "fetch_failed"), prompt)
	}
}

// A flat backend's request has its line: the images of its list sent,
// those the replay left out by reason, the backend's tokens.
func TestFlatRequestLog(t *testing.T) {
	r := newFlatRig(t, upstream.LlamaCpp, nil, nil)
	r.serve(Config{RequestLog: true})
	r.chat(t, r.history(6)...)
	var lines []session.Request
	for deadline := time.Now().Add(5 * time.Second); len(lines) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get(r.url + "/v1/requests")
		if err != nil {
			t.Fatal(err)
		}
		var list struct{ Data []session.Request }
		json.NewDecoder(resp.Body).Decode(&list)
		resp.Body.Close()
		lines = list.Data
	}
	if len(lines) != 1 {
		t.Fatalf("%d lines", len(lines))
	}
	sent, capped := 0, 0
	for _, img := range lines[0].Images {
		switch {
		case img.Sent && img.Ref.Valid() && img.Tokens > 0:
			sent++
		case !img.Sent && img.Reason == "cap":
			capped++
		}
	}
	if l := lines[0]; sent != 4 || capped != 2 || l.Conversation == "" || l.Upstream != "local" || l.Input == 0 || l.Status != 200 {
		t.Fatalf("%d sent, %d capped: %+v", sent, capped, l)
	}
}
