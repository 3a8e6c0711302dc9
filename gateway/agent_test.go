package gateway

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
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
	"github.com/prometheus/client_golang/prometheus"
)

// agentProfile is Claude's image rule with text at four characters a token
// (what pricedUpstream bills), in a window the test chooses.
func agentProfile(window int) tokens.Profile {
	return tokens.Profile{Name: "agent", Match: []string{"agent-*"}, Family: "anthropic", ContextWindow: window, Vision: true,
		Tokenizer: "chars4", Image: tokens.ImageRule{Rule: "anthropic_patch", MaxEdge: 1568, MaxTokens: 1568},
		Cache:  tokens.CacheRules{MinTokens: 1024, Breakpoints: 4, TTL: 5 * time.Minute},
		Prices: &tokens.Prices{Input: 3, Output: 15, CacheRead: 0.3, CacheWrite: 3.75, CacheWrite1h: 6}}
}

// pricedUpstream is an Anthropic Messages endpoint built from the API
// reference, not from imgctx's codec: it reads the documented request shape
// with encoding/json, bills every request from what it carries (10 tokens,
// 4 a message, text at four characters a token, each image by Claude's
// rule from its decoded header), emulates the prompt cache (the leading
// blocks shared with the previous request are read from cache, the rest
// written), refuses a prompt over its window, and answers what the test
// scripted: tool calls, or text.
type pricedUpstream struct {
	t       testing.TB
	profile tokens.Profile
	srv     *httptest.Server

	mu       sync.Mutex
	answered int    // requests answered
	body     []byte // the last one answered
	images   int    // and the image tokens billed for it
	prev     []block
	written  int // cache-written tokens, all requests
	read     int
	breaks   int   // requests that did not begin with all of the previous one
	next     reply // the next answer
	overflow int   // refuse prompts over this many tokens (0: the window)
	calls    int
}

type reply struct {
	tools int  // tool_use blocks to answer with (0: text, end_turn)
	cut   bool // stop_reason max_tokens
}

// block is one billed unit of a request, for the cache emulation.
type block struct {
	key  string
	cost int
}

func newPriced(t testing.TB, p tokens.Profile) *pricedUpstream {
	u := &pricedUpstream{t: t, profile: p}
	u.srv = httptest.NewServer(http.HandlerFunc(u.handle))
	t.Cleanup(u.srv.Close)
	return u
}

type apiRequest struct {
	Model    string            `json:"model"`
	System   json.RawMessage   `json:"system"`
	Messages []json.RawMessage `json:"messages"`
}

type apiMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type apiBlock struct {
	Type    string          `json:"type"`
	Text    string          `json:"text"`
	Name    string          `json:"name"`
	Input   json.RawMessage `json:"input"`
	Content json.RawMessage `json:"content"`
	Source  *struct {
		Type string `json:"type"`
		Data string `json:"data"`
	} `json:"source"`
}

// price bills a request, block by block.
func (u *pricedUpstream) price(body []byte) (blocks []block, images int, err error) {
	var r apiRequest
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, 0, err
	}
	c := tokens.Chars4{}
	blocks = append(blocks, block{"request", 10})
	var content func(raw json.RawMessage) error
	content = func(raw json.RawMessage) error {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			blocks = append(blocks, block{s, c.Count(s)})
			return nil
		}
		var bs []apiBlock
		if err := json.Unmarshal(raw, &bs); err != nil {
			return err
		}
		for _, b := range bs {
			key, _ := json.Marshal(b)
			switch b.Type {
			case "text":
				blocks = append(blocks, block{string(key), c.Count(b.Text)})
			case "compaction": // the provider's summary of what came before
				blocks = append(blocks, block{string(key), c.Count(string(b.Content))})
			case "tool_use":
				blocks = append(blocks, block{string(key), c.Count(b.Name) + c.Count(string(b.Input))})
			case "tool_result":
				blocks = append(blocks, block{"tool_result", 0})
				if len(b.Content) > 0 {
					if err := content(b.Content); err != nil {
						return err
					}
				}
			case "image":
				data, err := base64.StdEncoding.DecodeString(b.Source.Data)
				if err != nil {
					return fmt.Errorf("image data: %w", err)
				}
				w, h, err := media.Dimensions(data, media.Limits{})
				if err != nil {
					return err
				}
				n, _ := tokens.ImageTokens(u.profile, w, h, "")
				images += n
				blocks = append(blocks, block{string(key), n})
			default:
				return fmt.Errorf("unexpected block type %q", b.Type)
			}
		}
		return nil
	}
	if len(r.System) > 0 {
		if err := content(r.System); err != nil {
			return nil, 0, err
		}
	}
	for _, raw := range r.Messages {
		var m apiMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, 0, err
		}
		blocks = append(blocks, block{"message " + m.Role, tokens.MessageFraming})
		if err := content(m.Content); err != nil {
			return nil, 0, err
		}
	}
	return blocks, images, nil
}

func (u *pricedUpstream) handle(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // not a request: its body never came whole (an abandoned upstream.Early)
	}
	blocks, images, err := u.price(body)
	if err != nil {
		u.t.Errorf("upstream: a request off the documented shape: %v", err)
		w.WriteHeader(400)
		return
	}
	prompt := 0
	for _, b := range blocks {
		prompt += b.cost
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls++
	limit := u.overflow
	if limit == 0 {
		limit = u.profile.ContextWindow
	}
	w.Header().Set("Content-Type", "application/json")
	if prompt > limit {
		w.WriteHeader(400)
		fmt.Fprintf(w, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: %d tokens > %d maximum"}}`, prompt, limit)
		return
	}
	cached := 0
	for i := 0; i < len(blocks) && i < len(u.prev) && blocks[i] == u.prev[i]; i++ {
		cached += blocks[i].cost
	}
	if i := len(u.prev); i > 0 && (len(blocks) < i || cached < sum(u.prev)) {
		u.breaks++
	}
	u.prev = blocks
	u.read += cached
	u.written += prompt - cached
	u.answered++
	u.body, u.images = body, images
	n := u.answered
	var content []string
	stop := "end_turn"
	if u.next.tools == 0 {
		content = append(content, `{"type":"text","text":"Done."}`)
	}
	for i := range u.next.tools {
		content = append(content, fmt.Sprintf(`{"type":"tool_use","id":"toolu_%d_%d","name":"screenshot","input":{}}`, n, i))
		stop = "tool_use"
	}
	if u.next.cut {
		stop = "max_tokens"
	}
	fmt.Fprintf(w, `{"id":"msg_%d","type":"message","role":"assistant","model":"agent-1","content":[%s],"stop_reason":"%s","stop_sequence":null,"usage":{"input_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d,"output_tokens":7}}`,
		n, strings.Join(content, ","), stop, prompt-cached-max(prompt-cached-3, 0), max(prompt-cached-3, 0), cached)
}

func sum(bs []block) int {
	n := 0
	for _, b := range bs {
		n += b.cost
	}
	return n
}

// expire empties the emulated cache, as a provider's TTL would.
func (u *pricedUpstream) expire() {
	u.mu.Lock()
	u.prev = nil
	u.mu.Unlock()
}

func (u *pricedUpstream) last() ([]byte, int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.body, u.images
}

// agentRig is a gateway in front of a pricedUpstream, on stores the test
// may keep across a restart.
type agentRig struct {
	up       *pricedUpstream
	sessions session.Store
	images   imagestore.Store
	profile  tokens.Profile
	cached   int // engine.ProxyCached
	lowWater float64
	hold     bool    // policy.KeepConfig.Hold
	sight    float64 // policy.KeepConfig.Sight
	recall   bool    // Config.Recall
	imageCap int     // engine.Config.ProxyMaxImages
	window   bool    // engine.Config.ProxyClientWindow
	keys     map[string]string
	cfg      Config       // the rest of the gateway's config
	log      *slog.Logger // nil: discarded
	clock    func() time.Time
	server   *Server
	done     *finished
	srv      *httptest.Server
	reg      *prometheus.Registry
}

func newAgentRig(t testing.TB, window int, sessions session.Store) *agentRig {
	a := &agentRig{profile: agentProfile(window), sessions: sessions, images: imagestore.Verified{Store: &imagestore.Mem{}}, sight: policy.DefaultSight}
	a.up = newPriced(t, a.profile)
	a.restart(t)
	return a
}

// restart builds a new gateway and engine over the same stores, as a
// restarted process would: the old one stopped once its requests had
// ended, the decisions written behind their answers included.
func (a *agentRig) restart(t testing.TB) {
	if a.srv != nil {
		a.srv.Close()
		a.done.wait()
	}
	tbl, _ := tokens.Default().With(a.profile)
	e := &engine.Engine{Config: engine.Config{ProxyCached: a.cached, KeepLowWater: a.lowWater, Keep: policy.KeepConfig{Hold: a.hold, Sight: a.sight}, ProxyMaxImages: a.imageCap, ProxyClientWindow: a.window}, Now: a.clock, Images: a.images, Sessions: a.sessions, Profiles: tbl,
		Upstream: &upstream.Client{Format: upstream.Anthropic, BaseURL: a.up.srv.URL, APIKey: "k", MaxRetries: -1}}
	a.reg = prometheus.NewRegistry()
	log := a.log
	if log == nil {
		log = discardLogger()
	}
	cfg := a.cfg
	cfg.MaxBodyBytes, cfg.Recall, cfg.Keys = 64<<20, a.recall, a.keys
	a.server = New(cfg, e, a.reg, log)
	t.Cleanup(a.server.Close)
	a.done = finish(a.server)
	a.srv = httptest.NewServer(a.done)
	t.Cleanup(a.srv.Close)
}

// stored is the session store as the test reads it, once the gateway's
// requests have ended.
func (a *agentRig) stored() session.Store { return settledStore{a.sessions, a.done} }

// counter reads one sample of imgctx_images_total.
func (a *agentRig) counter(event, code string) int {
	mfs, _ := a.reg.Gather()
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != "imgctx_images_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["event"] == event && (code == "*" || labels["reason"] == code) {
				n += int(m.GetCounter().GetValue())
			}
		}
	}
	return n
}

// agent drives a conversation the way a coding agent does: the whole
// history re-sent on every request as documented Anthropic JSON, the
// assistant's content appended as it came, tool results (with screenshots,
// and sometimes a reminder text block beside them) in a user message.
type agent struct {
	t       tester
	rig     *agentRig
	header  map[string]string
	first   string
	msgs    []string // raw JSON messages
	shots   int
	pending []string // tool_use ids the last reply opened
	sent    [][]byte // the upstream bodies, one per request
	images  []int    // images the client sent, per request
	png     []byte
	// direct, when set, sends to the upstream itself, each body first
	// passed through it (a client-side policy to compare with).
	direct func([]byte) []byte
}

// tester is what the agent needs of a *testing.T or a *rapid.T.
type tester interface {
	Helper()
	Fatal(...any)
	Fatalf(string, ...any)
}

func newAgent(t testing.TB, rig *agentRig, first string) *agent {
	raw, _ := samplePNG(t)
	return &agent{t: t, rig: rig, first: first, png: raw, header: map[string]string{}}
}

func (g *agent) body() []byte {
	return []byte(`{"model":"agent-1","max_tokens":1024,"system":"You drive a browser.","messages":[` + strings.Join(g.msgs, ",") + `]}`)
}

// send posts the history; it fails the test on an error answer.
func (g *agent) send(next reply) *http.Response {
	g.t.Helper()
	resp, b := g.post(next)
	if resp.StatusCode != 200 {
		g.t.Fatalf("request %d: %d %s", len(g.sent)+1, resp.StatusCode, b)
	}
	return resp
}

func (g *agent) post(next reply) (*http.Response, []byte) {
	g.t.Helper()
	g.rig.up.mu.Lock()
	g.rig.up.next = next
	g.rig.up.mu.Unlock()
	body := g.body()
	url, out := g.rig.srv.URL, body
	if g.direct != nil {
		url, out = g.rig.up.srv.URL, g.direct(body)
	}
	req, _ := http.NewRequest("POST", url+"/v1/messages", bytes.NewReader(out))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	for k, v := range g.header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == 200 {
		up, _ := g.rig.up.last()
		g.sent = append(g.sent, up)
		g.images = append(g.images, bytes.Count(body, []byte(`"type":"image"`)))
		var m struct {
			Content []json.RawMessage `json:"content"`
		}
		json.Unmarshal(b, &m)
		content := make([]string, len(m.Content))
		for i, c := range m.Content {
			content[i] = string(c)
		}
		g.msgs = append(g.msgs, `{"role":"assistant","content":[`+strings.Join(content, ",")+`]}`)
		g.pending = g.pending[:0]
		for _, c := range m.Content {
			var tu struct{ Type, ID string }
			json.Unmarshal(c, &tu)
			if tu.Type == "tool_use" {
				g.pending = append(g.pending, tu.ID)
			}
		}
	}
	return resp, b
}

// human appends the human's message.
func (g *agent) human(text string) {
	g.msgs = append(g.msgs, fmt.Sprintf(`{"role":"user","content":[{"type":"text","text":%q}]}`, text))
}

// results answers every open tool call, each with its screenshots (a fresh
// image each, or the previous one again), with a reminder block beside
// them when asked.
func (g *agent) results(shotsEach int, reminder, repeat bool) {
	var blocks []string
	for _, id := range g.pending {
		parts := []string{`{"type":"text","text":"captured"}`}
		for range shotsEach {
			if !repeat || g.shots == 0 {
				g.shots++
			}
			data := base64.StdEncoding.EncodeToString(distinctPNG(g.png, g.shots))
			parts = append(parts, `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"`+data+`"}}`)
		}
		blocks = append(blocks, `{"type":"tool_result","tool_use_id":"`+id+`","content":[`+strings.Join(parts, ",")+`]}`)
	}
	if reminder {
		blocks = append(blocks, `{"type":"text","text":"<system-reminder>The user is watching.</system-reminder>"}`)
	}
	g.msgs = append(g.msgs, `{"role":"user","content":[`+strings.Join(blocks, ",")+`]}`)
}

// start opens the conversation with its first human message.
func (g *agent) start() { g.human(g.first) }
