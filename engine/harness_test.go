package engine

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/openai"
)

// testProfile prices images with Anthropic's 28-px rule and text at four
// characters a token, in a window the test chooses.
func testProfile(window int) tokens.Profile {
	return tokens.Profile{Name: "scripted", Match: []string{"scripted-*"}, Family: "test", ContextWindow: window, Vision: true,
		Tokenizer: "chars4", Image: tokens.ImageRule{Rule: "anthropic_patch", MaxEdge: 1568, MaxTokens: 1568}}
}

// reply is what the scripted upstream answers to one model request.
type reply struct {
	text       string
	toolCall   string // name of a tool to call
	cut        bool   // cut by max_tokens ("length")
	windowFull bool   // Anthropic model_context_window_exceeded
	// recall calls imgctx_recall with the first handle a marker of the
	// request names (or this one, when set).
	recall       bool
	recallHandle string
	args         string // the tool call's arguments, JSON
	also         string // a second tool to call in the same reply
}

// recallHandleIn finds a marker's handle in a request's JSON.
var recallHandleIn = regexp.MustCompile(`imgctx_recall\(\\"(i[a-z2-7]{11})\\"\)`)

// scripted is an upstream speaking one real wire format. It prices each
// request from what it carries — text by the profile's counter, images from
// their decoded headers by the profile's rule — so measurements can be
// checked against the truth.
type scripted struct {
	t       *testing.T
	format  upstream.Format
	profile tokens.Profile
	srv     *httptest.Server

	mu          sync.Mutex
	replies     []reply
	requests    [][]byte // model requests, in order
	summaries   [][]byte // summariser requests
	summaryCost []int    // prompt tokens charged per summariser request
	prompts     []int    // prompt tokens charged per model request
	imageTokens []int    // of which image tokens
	overflowAt  int      // answer prompt-too-long above this many tokens (0: the window)
	failNext    int      // answer 503 this many times first
	// summaryOverflow answers the summariser's requests prompt-too-long.
	summaryOverflow bool
}

func newScripted(t *testing.T, format upstream.Format, p tokens.Profile, replies ...reply) *scripted {
	s := &scripted{t: t, format: format, profile: p, replies: replies}
	s.srv = httptest.NewServer(http.HandlerFunc(s.handle))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *scripted) client() *upstream.Client {
	return &upstream.Client{Format: s.format, BaseURL: s.srv.URL, APIKey: "test-key", Backoff: 1, MaxBackoff: 1}
}

func (s *scripted) decode(body []byte) []chat.Message {
	if s.format == upstream.Anthropic {
		r, err := anthropic.DecodeRequest(body)
		if err != nil {
			s.t.Errorf("upstream got an invalid request: %v", err)
			return nil
		}
		return r.Messages
	}
	r, err := openai.DecodeRequest(body)
	if err != nil {
		s.t.Errorf("upstream got an invalid request: %v", err)
		return nil
	}
	return r.Messages
}

// price charges a request: 10 tokens of overhead, each message's framing,
// text by the counter, and each image at its true cost.
func (s *scripted) price(msgs []chat.Message) (prompt, images int) {
	counter := tokens.CounterFor(s.profile.Tokenizer)
	prompt = 10
	for _, m := range msgs {
		prompt += tokens.MessageFraming
		chat.Walk(m.Parts, func(p chat.Part, _ int) bool {
			switch p := p.(type) {
			case chat.Text:
				prompt += counter.Count(p.Text)
			case chat.ToolCall:
				prompt += counter.Count(p.Name) + counter.Count(p.Arguments)
			case chat.Image:
				d, err := media.ParseDataURL(p.URL)
				if err != nil {
					s.t.Errorf("upstream got an image that is not inline: %.40q", p.URL)
					return true
				}
				w, h, _ := media.Dimensions(d.Data, media.Limits{})
				n, _ := tokens.ImageTokens(s.profile, w, h, "")
				images += n
			}
			return true
		})
	}
	return prompt + images, images
}

func (s *scripted) handle(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failNext > 0 {
		s.failNext--
		w.WriteHeader(503)
		io.WriteString(w, `{"error":{"message":"busy","type":"server_error"}}`)
		return
	}
	msgs := s.decode(body)
	shared := len(msgs) > 0 && strings.Contains(msgs[len(msgs)-1].TextContent(), SharedInstruction)
	if shared || len(msgs) > 0 && msgs[0].Role == chat.System && msgs[0].TextContent() == SummaryPrompt {
		s.summaries = append(s.summaries, body)
		if shared || !bytes.Contains(body, []byte(";base64,")) && !bytes.Contains(body, []byte(`"type":"base64"`)) {
			p, _ := s.price(msgs)
			s.summaryCost = append(s.summaryCost, p)
		}
		if s.summaryOverflow {
			w.WriteHeader(400)
			if s.format == upstream.Anthropic {
				io.WriteString(w, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 300000 tokens > 200000 maximum"}}`)
			} else {
				io.WriteString(w, `{"error":{"message":"This model's maximum context length is 200000 tokens. However, your messages resulted in 300000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`)
			}
			return
		}
		s.answer(w, reply{text: "Summary: the user asked for screenshots of the login page."}, 200, 20)
		return
	}
	prompt, images := s.price(msgs)
	limit := s.overflowAt
	if limit == 0 {
		limit = s.profile.ContextWindow
	}
	if prompt > limit {
		w.WriteHeader(400)
		if s.format == upstream.Anthropic {
			fmt.Fprintf(w, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: %d tokens > %d maximum"}}`, prompt, limit)
		} else {
			fmt.Fprintf(w, `{"error":{"message":"This model's maximum context length is %d tokens. However, your messages resulted in %d tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`, limit, prompt)
		}
		return
	}
	s.requests = append(s.requests, body)
	s.prompts = append(s.prompts, prompt)
	s.imageTokens = append(s.imageTokens, images)
	if len(s.replies) == 0 {
		s.t.Errorf("upstream: no scripted reply left for request %d", len(s.requests))
		w.WriteHeader(500)
		return
	}
	rep := s.replies[0]
	s.replies = s.replies[1:]
	if rep.recall {
		rep.toolCall, rep.args = chat.RecallTool, `{"handle":"`+rep.recallHandle+`"}`
		if m := recallHandleIn.FindStringSubmatch(string(body)); m != nil && rep.recallHandle == "" {
			rep.args = `{"handle":"` + m[1] + `"}`
		}
	}
	s.answer(w, rep, prompt, 12)
}

func (s *scripted) answer(w http.ResponseWriter, rep reply, prompt, output int) {
	w.Header().Set("Content-Type", "application/json")
	if s.format == upstream.Anthropic {
		content := []map[string]any{}
		if rep.text != "" {
			content = append(content, map[string]any{"type": "text", "text": rep.text})
		}
		stop := "end_turn"
		if rep.toolCall != "" {
			input := json.RawMessage(`{}`)
			if rep.args != "" {
				input = json.RawMessage(rep.args)
			}
			content = append(content, map[string]any{"type": "tool_use", "id": fmt.Sprintf("toolu_%d", len(s.requests)), "name": rep.toolCall, "input": input})
			stop = "tool_use"
		}
		if rep.also != "" {
			content = append(content, map[string]any{"type": "tool_use", "id": fmt.Sprintf("toolu_%d_b", len(s.requests)), "name": rep.also, "input": map[string]any{}})
		}
		if rep.cut {
			stop = "max_tokens"
		}
		if rep.windowFull {
			stop = "model_context_window_exceeded"
		}
		// Split the prompt across Anthropic's three input fields.
		json.NewEncoder(w).Encode(map[string]any{"type": "message", "role": "assistant", "content": content, "stop_reason": stop,
			"usage": map[string]int{"input_tokens": prompt / 4, "cache_read_input_tokens": prompt / 2, "cache_creation_input_tokens": prompt - prompt/4 - prompt/2, "output_tokens": output}})
		return
	}
	msg := map[string]any{"role": "assistant", "content": rep.text}
	finish := "stop"
	if rep.toolCall != "" {
		args := "{}"
		if rep.args != "" {
			args = rep.args
		}
		calls := []map[string]any{{"id": fmt.Sprintf("call_%d", len(s.requests)), "type": "function", "function": map[string]string{"name": rep.toolCall, "arguments": args}}}
		if rep.also != "" {
			calls = append(calls, map[string]any{"id": fmt.Sprintf("call_%d_b", len(s.requests)), "type": "function", "function": map[string]string{"name": rep.also, "arguments": "{}"}})
		}
		msg["tool_calls"] = calls
		finish = "tool_calls"
	}
	if rep.cut || rep.windowFull {
		finish = "length"
	}
	json.NewEncoder(w).Encode(map[string]any{"object": "chat.completion", "choices": []map[string]any{{"index": 0, "message": msg, "finish_reason": finish}},
		"usage": map[string]any{"prompt_tokens": prompt, "completion_tokens": output, "prompt_tokens_details": map[string]int{"cached_tokens": prompt / 2}}})
}

// screenshot is a PNG of w×h with some structure, as a data URL.
func screenshot(w, h int, seed uint8) string {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.Set(x, y, color.RGBA{uint8(x/40) * 20, uint8(y/40)*20 + seed, seed, 255})
		}
	}
	var b bytes.Buffer
	png.Encode(&b, img)
	return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes())
}

// rig is an engine over a scripted upstream, with in-memory or on-disk stores.
type rig struct {
	up     *scripted
	engine *Engine
	dir    string
	events []Event
	// held is each session's live context as the engine held it after
	// the turn before, and a deep copy of it: a turn shares those
	// messages and must not change one in place (cloneState).
	held map[session.ID][2][]chat.Message
}

func newRig(t *testing.T, format upstream.Format, window int, replies ...reply) *rig {
	r := &rig{dir: t.TempDir()}
	p := testProfile(window)
	r.up = newScripted(t, format, p, replies...)
	r.engine = r.open(t)
	return r
}

// open builds an engine on r.dir: a fresh process on the same data.
func (r *rig) open(t *testing.T) *Engine {
	fsys, err := imagestore.NewFS(r.dir + "/images")
	if err != nil {
		t.Fatal(err)
	}
	images := imagestore.Verified{Store: fsys}
	sessions, err := openSessions(r.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sessions.Close() })
	tbl, _ := tokens.Default().With(r.up.profile)
	return &Engine{
		Config:   Config{CompactThreshold: 10}, // tests turn proactive pressure on where they want it
		Images:   images,
		Sessions: sessions,
		Profiles: tbl,
		Upstream: r.up.client(),
		Sink:     func(e Event) { r.events = append(r.events, e) },
	}
}

func (r *rig) session(t *testing.T, keep bool) session.ID {
	m, err := r.engine.NewSession(t.Context(), "acme", chat.Settings{Model: "scripted-vl", KeepTurnImages: keep}, chat.Main)
	if err != nil {
		t.Fatal(err)
	}
	return m.ID
}

func user(text string) []chat.Message {
	return []chat.Message{{Role: chat.User, Parts: []chat.Part{chat.Text{Text: text}}}}
}

// toolResult answers the last reply's tool call with a screenshot.
func toolResult(t *testing.T, res *Result, shotURL string) []chat.Message {
	t.Helper()
	var id string
	for _, p := range res.Message.Parts {
		if tc, ok := p.(chat.ToolCall); ok {
			id = tc.ID
		}
	}
	if id == "" {
		t.Fatalf("the reply called no tool: %+v", res.Message)
	}
	return []chat.Message{{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: id, Name: "screenshot",
		Parts: []chat.Part{chat.Text{Text: "captured"}, chat.Image{URL: shotURL}}}}}}
}

func (r *rig) call(t *testing.T, id session.ID, msgs []chat.Message) *Result {
	t.Helper()
	res, err := r.engine.Call(t.Context(), "acme", id, msgs)
	if err != nil {
		t.Fatal(err)
	}
	r.heldIsStored(t, id)
	return res
}

// heldIsStored checks the state the engine holds for the session (its
// next turn starts from it) is the one the store holds, message for
// message: the JSON memo wrote each changed message anew.
func (r *rig) heldIsStored(t *testing.T, id session.ID) {
	t.Helper()
	el, ok := r.engine.states.m[stateKey{"acme", id}]
	if !ok {
		t.Fatal("the engine holds no state for the session after a turn")
	}
	held := el.Value.(*cachedState).st
	if was, ok := r.held[id]; ok {
		for i := range was[0] {
			if !chat.Equal(was[0][i], was[1][i]) {
				t.Fatalf("live message %d, held from the turn before, was changed in place: now %+v, was %+v", i, was[0][i], was[1][i])
			}
		}
	}
	if r.held == nil {
		r.held = map[session.ID][2][]chat.Message{}
	}
	r.held[id] = [2][]chat.Message{held.Live, chat.CloneMessages(held.Live)}
	stored := r.live(t, id)
	if len(held.Live) != len(stored.Live) {
		t.Fatalf("held %d live messages, stored %d", len(held.Live), len(stored.Live))
	}
	for i := range held.Live {
		if !chat.Equal(held.Live[i], stored.Live[i]) {
			t.Fatalf("live message %d: held %+v, stored %+v", i, held.Live[i], stored.Live[i])
		}
	}
}

func (r *rig) live(t *testing.T, id session.ID) session.State {
	snap, err := r.engine.Sessions.Load(t.Context(), "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	return snap.State
}

func keptImages(msgs []chat.Message) []chat.Image {
	var out []chat.Image
	for _, m := range msgs {
		chat.Walk(m.Parts, func(p chat.Part, _ int) bool {
			if img, ok := p.(chat.Image); ok && img.Keep == chat.Kept {
				out = append(out, img)
			}
			return true
		})
	}
	return out
}

// compactions lists the Compaction of each "compacted" event, by commas.
func compactions(events []Event) string {
	var out []string
	for _, e := range events {
		if e.Kind == "compacted" {
			out = append(out, e.Compaction)
		}
	}
	return strings.Join(out, ",")
}

func hasEvent(events []Event, kind, why string) bool {
	for _, e := range events {
		if e.Kind == kind && (why == "" || string(e.Reason) == why || strings.Contains(e.Detail, why)) {
			return true
		}
	}
	return false
}
