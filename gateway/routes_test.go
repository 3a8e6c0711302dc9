package gateway

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/imgctx/imgctx/upstream"
	"github.com/openai/openai-go/v3"
)

// twoUpstreams is one gateway in front of an OpenAI-format and an
// Anthropic-format upstream, each answering /v1/models too.
func twoUpstreams(t *testing.T) (*gw, *fakeUpstream) {
	g := newGW(t, upstream.OpenAI, nil)
	ant := newFake(t, upstream.Anthropic)
	models := func(f *fakeUpstream, body string) {
		h := f.srv.Config.Handler
		f.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasPrefix(r.URL.Path, "/v1/models") {
				w.Header().Set("Content-Type", "application/json")
				io.WriteString(w, body)
				return
			}
			h.ServeHTTP(w, r)
		})
	}
	models(g.up, `{"object":"list","data":[{"id":"gpt-4o","object":"model","created":1,"owned_by":"openai"}]}`)
	models(ant, `{"data":[{"type":"model","id":"claude-sonnet-4-6","display_name":"Claude Sonnet 4.6","created_at":"2026-01-01T00:00:00Z"}],"has_more":false,"first_id":"claude-sonnet-4-6","last_id":"claude-sonnet-4-6"}`)
	g.server.cfg.Upstreams = []*Upstream{
		{Name: "claude", Client: &upstream.Client{Format: upstream.Anthropic, BaseURL: ant.srv.URL, MaxRetries: -1}, Models: []string{"claude-*"}},
		{Name: "openai", Client: g.engine.Upstream},
	}
	return g, ant
}

// One process serves openai-go and anthropic-sdk-go clients at once, each
// routed to its own upstream.
func TestBothSDKsAgainstOneGatewayWithTwoUpstreams(t *testing.T) {
	g, ant := twoUpstreams(t)
	oc := openaiClient(g, "sk-user")
	res, err := oc.Chat.Completions.New(t.Context(), openai.ChatCompletionNewParams{
		Model: "gpt-4o", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if err != nil || res.Choices[0].Message.Content != "A login form." {
		t.Fatalf("openai-go: %v %+v", err, res)
	}
	ac := anthropic.NewClient(aoption.WithBaseURL(g.srv.URL), aoption.WithAPIKey("sk-ant-user"), aoption.WithMaxRetries(0))
	msg, err := ac.Messages.New(t.Context(), anthropic.MessageNewParams{Model: "claude-sonnet-4-6", MaxTokens: 64,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	if err != nil || msg.Content[0].Text != "A login form." {
		t.Fatalf("anthropic-sdk-go: %v %+v", err, msg)
	}
	if len(g.up.received()) != 1 || len(ant.received()) != 1 {
		t.Fatalf("openai upstream got %d, anthropic upstream %d; want one each", len(g.up.received()), len(ant.received()))
	}
	// count_tokens goes to the Anthropic upstream too.
	ac.Messages.CountTokens(t.Context(), anthropic.MessageCountTokensParams{Model: "claude-sonnet-4-6",
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	if len(ant.received()) != 2 || len(g.up.received()) != 1 {
		t.Fatalf("count_tokens did not reach the Anthropic upstream")
	}
	// Models: each SDK sees its format's upstream; a model no upstream serves is a 404 in the client's shape.
	page, err := oc.Models.List(t.Context())
	if err != nil || len(page.Data) != 1 || page.Data[0].ID != "gpt-4o" {
		t.Fatalf("openai models: %v %+v", err, page)
	}
	ap, err := ac.Models.List(t.Context(), anthropic.ModelListParams{})
	if err != nil || len(ap.Data) != 1 || ap.Data[0].ID != "claude-sonnet-4-6" {
		t.Fatalf("anthropic models: %v %+v", err, ap)
	}
	_, err = ac.Messages.New(t.Context(), anthropic.MessageNewParams{Model: "gemini-3-pro", MaxTokens: 5,
		Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock("hi"))}})
	var ae *anthropic.Error
	if !asError(err, &ae) || ae.StatusCode != 404 || !strings.Contains(ae.Error(), "no upstream of this gateway serves anthropic requests") {
		t.Fatalf("unrouted model: %v", err)
	}
}

// With two upstreams of one format, /v1/models merges their lists.
func TestModelsMergedAcrossUpstreams(t *testing.T) {
	g, _ := twoUpstreams(t)
	second := newFake(t, upstream.OpenAI)
	second.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"object":"list","data":[{"id":"qwen3-vl","object":"model","created":1,"owned_by":"local"}]}`)
	})
	g.server.cfg.Upstreams = append(g.server.cfg.Upstreams, &Upstream{Name: "local", Client: &upstream.Client{Format: upstream.OpenAI, BaseURL: second.srv.URL}})
	resp, body := g.do(t, "GET", "/v1/models", "", nil)
	var page struct {
		Object string `json:"object"`
		Data   []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &page) != nil || page.Object != "list" || len(page.Data) != 2 || page.Data[1].ID != "qwen3-vl" {
		t.Fatalf("merged models: %d %s", resp.StatusCode, body)
	}
}

// Unknown routes and methods answer JSON in the client's shape, counted.
func TestUnknownRoutesAnswerProviderJSON(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	for _, c := range []struct{ method, path, want string }{
		{"GET", "/v1/embeddings", `"code":"not_found_error"`},
		{"POST", "/v1/messages/batches", `"type":"error"`},
		{"DELETE", "/v1/chat/completions", `"code":"invalid_request_error"`},
		{"HEAD", "/", ""},
	} {
		resp, body := g.do(t, c.method, c.path, "", nil)
		want := 404
		if c.method == "DELETE" {
			want = 405
		}
		if resp.StatusCode != want || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") || !strings.Contains(string(body), c.want) {
			t.Errorf("%s %s: %d %q %s", c.method, c.path, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	}
	if m := metric(t, g, "imgctx_http_requests_total"); !strings.Contains(m, `route="not_found"`) {
		t.Fatalf("unknown routes not counted:\n%s", m)
	}
}

func asError(err error, target **anthropic.Error) bool { return errors.As(err, target) }
