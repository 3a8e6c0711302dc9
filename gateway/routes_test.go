package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/upstream"
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

// An Anthropic client's list (anthropic-version) merges the Anthropic
// upstreams' pages into one in Anthropic's shape: every model, no more
// pages, named by its first and last.
func TestAnthropicModelsMergedAcrossUpstreams(t *testing.T) {
	g, _ := twoUpstreams(t)
	second := newFake(t, upstream.Anthropic)
	second.srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"data":[{"type":"model","id":"claude-haiku-4-5","display_name":"Claude Haiku 4.5","created_at":"2026-01-01T00:00:00Z"}],"has_more":false,"first_id":"claude-haiku-4-5","last_id":"claude-haiku-4-5"}`)
	})
	g.server.cfg.Upstreams = append(g.server.cfg.Upstreams, &Upstream{Name: "haiku", Client: &upstream.Client{Format: upstream.Anthropic, BaseURL: second.srv.URL}, Models: []string{"claude-haiku-*"}})
	resp, body := g.do(t, "GET", "/v1/models", "", nil, "anthropic-version", "2023-06-01")
	var page struct {
		Data []struct {
			ID, Type string
		} `json:"data"`
		HasMore *bool   `json:"has_more"`
		FirstID *string `json:"first_id"`
		LastID  *string `json:"last_id"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &page) != nil || len(page.Data) != 2 || page.Data[0].Type != "model" ||
		page.HasMore == nil || *page.HasMore || page.FirstID == nil || *page.FirstID != "claude-sonnet-4-6" || page.LastID == nil || *page.LastID != "claude-haiku-4-5" {
		t.Fatalf("merged Anthropic models: %d %s", resp.StatusCode, body)
	}
}

// With one upstream, a models request is the upstream's answer as it
// came — status, body, its headers — for the list, one model (the id
// with slashes a local server names its models by), an unknown one, and
// Gemini's list with its page query; the configured key goes upstream.
func TestModelsPassThroughFromOneUpstream(t *testing.T) {
	type seen struct{ path, query, auth, goog string }
	var got []seen
	models := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = append(got, seen{r.URL.Path, r.URL.RawQuery, r.Header.Get("Authorization"), r.Header.Get("x-goog-api-key")})
		w.Header().Set("X-Request-Id", "req-"+r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		if strings.HasSuffix(r.URL.Path, "/nope") {
			w.WriteHeader(404)
			io.WriteString(w, `{"error":{"message":"The model 'nope' does not exist","type":"invalid_request_error","code":"model_not_found"}}`)
			return
		}
		io.WriteString(w, `{"object":"list","data":[{"id":"`+r.URL.Path+`"}]}`)
	}))
	t.Cleanup(models.Close)
	for _, c := range []struct {
		format       upstream.Format
		path, status string
		want         seen
	}{
		{upstream.OpenAI, "/v1/models", "200", seen{"/v1/models", "", "Bearer upstream-key", ""}},
		{upstream.OpenAI, "/v1/models/Qwen/Qwen3-VL-8B", "200", seen{"/v1/models/Qwen/Qwen3-VL-8B", "", "Bearer upstream-key", ""}},
		{upstream.OpenAI, "/v1/models/nope", "404", seen{"/v1/models/nope", "", "Bearer upstream-key", ""}},
		{upstream.Gemini, "/v1beta/models?pageSize=5", "200", seen{"/v1beta/models", "pageSize=5", "", "upstream-key"}},
	} {
		got = nil
		g := newGW(t, upstream.OpenAI, nil)
		g.engine.Upstream = &upstream.Client{Format: c.format, BaseURL: models.URL, APIKey: "upstream-key", MaxRetries: -1}
		resp, body := g.do(t, "GET", c.path, "", nil)
		if fmt.Sprint(resp.StatusCode) != c.status || len(got) != 1 || got[0] != c.want {
			t.Fatalf("%s: %d %s; the upstream saw %+v, want %+v", c.path, resp.StatusCode, body, got, c.want)
		}
		if resp.Header.Get("X-Request-Id") != "req-"+c.want.path || (c.status == "200") != strings.Contains(string(body), `"id":"`+c.want.path+`"`) {
			t.Fatalf("%s: not the upstream's answer: %s %s", c.path, resp.Header, body)
		}
	}
}

// A gateway started with no upstream (serve on its embedded defaults)
// answers every route that needs one with 502 and how to give it one, in
// each client's own error shape, and sends and stores nothing.
func TestNoUpstreamSaysHowToConfigureOne(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	g.engine.Upstream = nil
	_, b64 := samplePNG(t)
	const how = "no upstream configured: start imgctx serve with --upstream or IMGCTX_UPSTREAM_BASE_URL"
	for _, c := range []struct{ path, body, shape string }{
		{"/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + b64 + `"}}]}]}`, `"type":"api_error"`},
		{"/v1/messages", `{"model":"claude-sonnet-4-6","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, `"type":"error"`},
		{"/v1/responses", `{"model":"gpt-5","input":"hi"}`, `"type":"api_error"`},
		{"/v1beta/models/gemini-2.5-flash:generateContent", `{"contents":[{"parts":[{"text":"hi"}]}]}`, `"status":"UNAVAILABLE"`},
		{"/v1/models", ``, `"type":"api_error"`},
	} {
		method := "POST"
		if c.body == "" {
			method = "GET"
		}
		resp, body := g.do(t, method, c.path, "", []byte(c.body))
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(body), how) || !strings.Contains(string(body), c.shape) {
			t.Errorf("%s: %d %s; want 502 saying %q in the shape %s", c.path, resp.StatusCode, body, how, c.shape)
		}
	}
	if n := g.stored(t, "default"); n != 0 {
		t.Fatalf("%d images stored for requests that could go nowhere", n)
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
