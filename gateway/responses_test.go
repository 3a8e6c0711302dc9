package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/responses"
	"github.com/prometheus/client_golang/prometheus"
)

// responsesUpstream is an OpenAI Responses endpoint built from the API
// reference with encoding/json: it bills each request from its input items
// (10 tokens, 4 an item, text at four characters a token, each input_image
// by the test profile's rule from its decoded header), answers with a
// function_call or a message, as a response object or as the documented
// response.* event stream, usage in input_tokens /
// input_tokens_details.cached_tokens.
type responsesUpstream struct {
	t       testing.TB
	profile tokens.Profile
	srv     *httptest.Server

	mu     sync.Mutex
	bodies [][]byte
	paths  []string
	images []int
	next   reply
}

func newResponsesUpstream(t testing.TB, p tokens.Profile) *responsesUpstream {
	u := &responsesUpstream{t: t, profile: p}
	u.srv = httptest.NewServer(http.HandlerFunc(u.handle))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *responsesUpstream) price(body []byte) (prompt, images int, stream bool, err error) {
	var r struct {
		Stream bool              `json:"stream"`
		Input  []json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return 0, 0, false, err
	}
	c := tokens.Chars4{}
	prompt = 10
	parts := func(raw json.RawMessage) error {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			prompt += c.Count(s)
			return nil
		}
		var ps []struct {
			Type     string `json:"type"`
			Text     string `json:"text"`
			ImageURL string `json:"image_url"`
		}
		if err := json.Unmarshal(raw, &ps); err != nil {
			return err
		}
		for _, p := range ps {
			switch p.Type {
			case "input_text", "output_text":
				prompt += c.Count(p.Text)
			case "input_file", "refusal":
			case "input_image":
				if p.ImageURL == "" {
					continue // a file_id: the provider's own
				}
				d, err := media.ParseDataURL(p.ImageURL)
				if err != nil {
					return fmt.Errorf("input_image not inline: %.40q", p.ImageURL)
				}
				w, h, err := media.Dimensions(d.Data, media.Limits{})
				if err != nil {
					return err
				}
				n, _ := tokens.ImageTokens(u.profile, w, h, "")
				images += n
			default:
				return fmt.Errorf("unexpected part type %q", p.Type)
			}
		}
		return nil
	}
	for _, raw := range r.Input {
		var it struct {
			Type      string          `json:"type"`
			Name      string          `json:"name"`
			Arguments string          `json:"arguments"`
			Content   json.RawMessage `json:"content"`
			Output    json.RawMessage `json:"output"`
		}
		if err := json.Unmarshal(raw, &it); err != nil {
			return 0, 0, false, err
		}
		prompt += tokens.MessageFraming + c.Count(it.Name) + c.Count(it.Arguments)
		for _, v := range []json.RawMessage{it.Content, it.Output} {
			if len(v) > 0 {
				if err := parts(v); err != nil {
					return 0, 0, false, err
				}
			}
		}
	}
	return prompt + images, images, r.Stream, nil
}

func (u *responsesUpstream) handle(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	prompt, images, stream, err := u.price(body)
	if err != nil {
		u.t.Errorf("responses upstream: a request off the documented shape: %v", err)
		w.WriteHeader(400)
		return
	}
	u.mu.Lock()
	u.bodies, u.paths, u.images = append(u.bodies, body), append(u.paths, r.URL.Path), append(u.images, images)
	n, next := len(u.bodies), u.next
	u.mu.Unlock()
	if r.URL.Path == "/v1/responses/input_tokens" {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"response.input_tokens","input_tokens":%d}`, prompt)
		return
	}
	item := fmt.Sprintf(`{"type":"message","id":"msg_%d","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Done.","annotations":[]}]}`, n)
	if next.tools > 0 {
		item = fmt.Sprintf(`{"type":"function_call","id":"fc_%d","call_id":"call_%d","name":"screenshot","arguments":"{}","status":"completed"}`, n, n)
	}
	resp := func(status string) string {
		return fmt.Sprintf(`{"id":"resp_%d","object":"response","created_at":1,"status":"%s","model":"agent-1","output":[%s],"usage":{"input_tokens":%d,"input_tokens_details":{"cached_tokens":0},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}}`,
			n, status, item, prompt, prompt+7)
	}
	if !stream {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, resp("completed"))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	events := []string{
		`event: response.created` + "\n" + `data: {"type":"response.created","sequence_number":0,"response":{"id":"resp_x","object":"response","status":"in_progress","output":[],"usage":null}}`,
		`event: response.output_item.added` + "\n" + `data: {"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":` + item + `}`,
		`event: response.output_item.done` + "\n" + `data: {"type":"response.output_item.done","sequence_number":2,"output_index":0,"item":` + item + `}`,
		`event: response.completed` + "\n" + `data: {"type":"response.completed","sequence_number":3,"response":` + resp("completed") + `}`,
	}
	for _, ev := range events {
		io.WriteString(w, ev+"\n\n")
		w.(http.Flusher).Flush()
	}
}

func (u *responsesUpstream) last() ([]byte, int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.bodies[len(u.bodies)-1], u.images[len(u.images)-1]
}

// codex drives a conversation as codex does on the Responses wire: the
// whole input re-sent each request, output items appended as they came,
// function_call_output items carrying a screenshot as input_image.
type codex struct {
	t       *testing.T
	url     string
	header  map[string]string
	key     string // prompt_cache_key
	stream  bool
	items   []string
	pending []string
	sent    [][]byte // what the upstream got, per request
	bodies  [][]byte // what the client sent
	png     []byte
	shots   int
}

func (c *codex) body() []byte {
	return []byte(fmt.Sprintf(`{"model":"agent-1","instructions":"You are a coding agent.","stream":%v,"store":false,"prompt_cache_key":%q,"input":[%s]}`,
		c.stream, c.key, strings.Join(c.items, ",")))
}

func (c *codex) post(up *responsesUpstream, next reply) (*http.Response, []byte) {
	c.t.Helper()
	up.mu.Lock()
	up.next = next
	up.mu.Unlock()
	c.bodies = append(c.bodies, c.body())
	req, _ := http.NewRequest("POST", c.url+"/v1/responses", bytes.NewReader(c.body()))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range c.header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		c.t.Fatalf("%d %s", resp.StatusCode, b)
	}
	body, _ := up.last()
	c.sent = append(c.sent, body)
	// The output items: from the response object, or from the stream's
	// response.output_item.done events.
	var out []json.RawMessage
	if c.stream {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var ev struct {
					Type string          `json:"type"`
					Item json.RawMessage `json:"item"`
				}
				if json.Unmarshal([]byte(data), &ev) == nil && ev.Type == "response.output_item.done" {
					out = append(out, ev.Item)
				}
			}
		}
	} else {
		var r struct {
			Output []json.RawMessage `json:"output"`
		}
		json.Unmarshal(b, &r)
		out = r.Output
	}
	c.pending = c.pending[:0]
	for _, it := range out {
		c.items = append(c.items, string(it))
		var call struct {
			Type   string `json:"type"`
			CallID string `json:"call_id"`
		}
		if json.Unmarshal(it, &call) == nil && call.Type == "function_call" {
			c.pending = append(c.pending, call.CallID)
		}
	}
	return resp, b
}

func (c *codex) user(text string) {
	c.items = append(c.items, fmt.Sprintf(`{"type":"message","role":"user","content":[{"type":"input_text","text":%q}]}`, text))
}

func (c *codex) outputs() {
	for _, id := range c.pending {
		c.shots++
		data := base64.StdEncoding.EncodeToString(distinctPNG(c.png, c.shots))
		c.items = append(c.items, fmt.Sprintf(`{"type":"function_call_output","call_id":%q,"output":[{"type":"input_text","text":"saved screen.png"},{"type":"input_image","image_url":"data:image/png;base64,%s","detail":"high"}]}`, id, data))
	}
}

type responsesRig struct {
	up       *responsesUpstream
	sessions session.Store
	images   *imagestore.Mem
	done     *finished
	srv      *httptest.Server
	reg      *prometheus.Registry
}

func newResponsesRig(t *testing.T, window int) *responsesRig {
	p := agentProfile(window)
	r := &responsesRig{up: newResponsesUpstream(t, p), sessions: &session.Mem{}, images: &imagestore.Mem{}, reg: prometheus.NewRegistry()}
	tbl, _ := tokens.Default().With(p)
	e := &engine.Engine{Images: imagestore.Verified{Store: r.images}, Sessions: r.sessions, Profiles: tbl,
		Upstream: &upstream.Client{Format: upstream.OpenAI, BaseURL: r.up.srv.URL, APIKey: "k", MaxRetries: -1}}
	r.done = finish(New(Config{MaxBodyBytes: 64 << 20}, e, r.reg, discardLogger()))
	r.srv = httptest.NewServer(r.done)
	t.Cleanup(r.srv.Close)
	return r
}

func (r *responsesRig) codex(t *testing.T, key string, stream bool) *codex {
	raw, _ := samplePNG(t)
	return &codex{t: t, url: r.srv.URL, key: key, stream: stream, png: raw, header: map[string]string{}}
}

func (r *responsesRig) decisions(t *testing.T, c *codex) session.Proxied {
	sp, err := responses.Scan(c.body(), wire.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := settledStore{r.sessions, r.done}.LoadProxied(context.Background(), "default", engine.ConversationKey("default", responses.Dialect, http.Header{}, sp))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A codex-shaped session on the Responses wire, streamed and not: the
// screenshot in a function_call_output reaches the upstream byte for byte
// and is stored once; it is kept at its billed cost; over the budget the
// next one is ephemeral and a marker (an input_text part) at the next
// turn, the rest of the body unchanged.
func TestResponsesCodexSession(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprint("stream=", stream), func(t *testing.T) {
			rig := newResponsesRig(t, 20_000) // budget 2,000: one screenshot
			c := rig.codex(t, "0199-codex-session", stream)
			c.user("Take a screenshot of the app.")
			c.post(rig.up, reply{tools: 1})
			c.outputs()
			c.post(rig.up, reply{tools: 1})
			if !bytes.Equal(c.sent[1], c.bodies[1]) {
				t.Fatal("the request with a screenshot did not reach the upstream byte for byte")
			}
			c.outputs()
			c.post(rig.up, reply{})
			n := 0
			rig.images.List(t.Context(), "default", func(imagestore.Info) error { n++; return nil })
			if n != 2 {
				t.Fatalf("%d images stored; want the two screenshots, once each", n)
			}
			if _, billed := rig.up.last(); billed != 2*1334 {
				t.Fatalf("billed %d image tokens", billed)
			}
			if d := rig.decisions(t, c); d.Images[0].Keep != chat.Kept || d.Images[0].Cost != 1334 {
				t.Fatalf("decisions %+v; want the first kept at the billed 1334", d.Images)
			}
			c.user("And now?")
			before := c.body()
			c.post(rig.up, reply{})
			last := c.sent[len(c.sent)-1]
			marker := `{"type":"input_text","text":"[image removed]"}`
			if bytes.Count(last, []byte(`"type":"input_image"`)) != 1 || !bytes.Contains(last, []byte(marker)) {
				t.Fatalf("next turn: %d images, marker %v", bytes.Count(last, []byte(`"type":"input_image"`)), bytes.Contains(last, []byte(marker)))
			}
			// Everything but the removed image is the client's bytes.
			i := bytes.Index(before, []byte(`{"type":"input_image","image_url":"data:image/png;base64,`+base64.StdEncoding.EncodeToString(distinctPNG(c.png, 2))))
			if i < 0 || !bytes.Equal(last[:i], before[:i]) || !bytes.HasSuffix(last, before[bytes.Index(before[i:], []byte(`"detail":"high"}`))+i+len(`"detail":"high"}`):]) {
				t.Fatal("the marker changed more than the image it stands for")
			}
		})
	}
}

// prompt_cache_key names the conversation: two with the same opening and
// different keys keep their own decisions.
func TestResponsesPromptCacheKeySeparatesConversations(t *testing.T) {
	rig := newResponsesRig(t, 200_000)
	a, b := rig.codex(t, "key-a", false), rig.codex(t, "key-b", false)
	for _, c := range []*codex{a, b} {
		c.user("Take a screenshot.")
		c.post(rig.up, reply{tools: 1})
	}
	a.outputs()
	a.post(rig.up, reply{})
	if len(rig.decisions(t, a).Images) != 1 || len(rig.decisions(t, b).Images) != 0 {
		t.Fatal("the conversations share decisions")
	}
}

// The side routes: input_tokens is forwarded with the images the next
// request would get and records nothing; a WebSocket upgrade gets 426, so
// the client falls back to HTTP.
func TestResponsesSideRoutes(t *testing.T) {
	rig := newResponsesRig(t, 200_000)
	c := rig.codex(t, "k", false)
	c.user("Take a screenshot.")
	c.post(rig.up, reply{tools: 1})
	c.outputs()
	req, _ := http.NewRequest("POST", rig.srv.URL+"/v1/responses/input_tokens", bytes.NewReader(c.body()))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"input_tokens":`)) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if d := rig.decisions(t, c); len(d.Images) != 0 || d.Messages != 1 {
		t.Fatalf("a token count recorded decisions: %+v", d)
	}
	c.post(rig.up, reply{})
	if d := rig.decisions(t, c); len(d.Images) != 1 || d.Images[0].Cost != 1334 {
		t.Fatalf("after the count, the real request measured %+v", d.Images)
	}
	ws, _ := http.NewRequest("GET", rig.srv.URL+"/v1/responses", nil)
	ws.Header.Set("Connection", "Upgrade")
	ws.Header.Set("Upgrade", "websocket")
	ws.Header.Set("Sec-WebSocket-Version", "13")
	ws.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	resp, err = http.DefaultClient.Do(ws)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUpgradeRequired {
		t.Fatalf("a WebSocket upgrade got %d; want 426", resp.StatusCode)
	}
}

// An upstream without a token-count endpoint (404): the count is imgctx's
// own estimate of the request it would send, and says so; a compaction
// request is not answered that way.
func TestCountWithoutTheUpstreamsEndpointIsEstimated(t *testing.T) {
	g := newGW(t, upstream.Anthropic, nil) // the fake answers /v1/messages/count_tokens … as a message: make it 404
	none := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(none.Close)
	g.engine.Upstream.BaseURL = none.URL
	_, b64 := samplePNG(t)
	body := `{"model":"claude-sonnet-4-6","messages":[{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + b64 + `"}}]}]}`
	resp, out := g.do(t, "POST", "/v1/messages/count_tokens", "", []byte(body))
	var c struct {
		InputTokens int `json:"input_tokens"`
	}
	json.Unmarshal(out, &c)
	if resp.StatusCode != 200 || resp.Header.Get("X-Imgctx-Token-Count") != "estimated" || c.InputTokens < 1000 {
		t.Fatalf("%d %s %q", resp.StatusCode, out, resp.Header.Get("X-Imgctx-Token-Count"))
	}
	if resp, _ := g.do(t, "POST", "/v1/messages", "", []byte(body)); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("a real request to the missing endpoint got %d; its 404 must come back", resp.StatusCode)
	}
}
