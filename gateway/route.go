package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/gemini"
	"github.com/imgctx/imgctx/wire/openai"
)

// Upstream is one model server of the drop-in routes (engine.Route).
type Upstream = engine.Route

// Routes is the routing table (the provider files sweep deletes with its
// configured keys).
func (s *Server) Routes() []*Upstream { return s.upstreams() }

// upstreams is the routing table: the configured list, or the engine's
// own upstream alone.
func (s *Server) upstreams() []*Upstream {
	if len(s.cfg.Upstreams) > 0 {
		return s.cfg.Upstreams
	}
	if s.engine.Upstream == nil || s.engine.Upstream.BaseURL == "" {
		return nil
	}
	return []*Upstream{{Name: "default", Client: s.engine.Upstream, Hints: s.engine.Hints, Files: s.engine.UpstreamFiles}}
}

// hopByHop are the headers that belong to one connection, never forwarded.
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func dropHopByHop(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, k := range hopByHop {
		h.Del(k)
	}
}

// forwardHeader is what of the client's headers goes upstream: all of them
// (anthropic-beta, User-Agent, X-Stainless-*, session ids, traceparent …)
// but hop-by-hop ones, those the transport sets itself (Host,
// Content-Length, Accept-Encoding; the body was decompressed), imgctx's own,
// and — when the gateway has keys of its own — the credentials the client
// used to reach the gateway.
func (s *Server) forwardHeader(r *http.Request) http.Header {
	h := r.Header.Clone()
	dropHopByHop(h)
	for _, k := range []string{"Content-Length", "Accept-Encoding", "Content-Encoding", "X-Upstream-Api-Key"} {
		h.Del(k)
	}
	for k := range h {
		if strings.HasPrefix(k, "X-Imgctx-") {
			delete(h, k)
		}
	}
	if len(s.cfg.Keys) > 0 {
		h.Del("Authorization")
		h.Del("X-Api-Key")
		h.Del("X-Goog-Api-Key")
	}
	return h
}

// forwardQuery is the client's query string, less the gateway key a Gemini
// client may send as key=.
func (s *Server) forwardQuery(r *http.Request) string {
	if len(s.cfg.Keys) == 0 || !r.URL.Query().Has("key") {
		return r.URL.RawQuery
	}
	q := r.URL.Query()
	q.Del("key")
	return q.Encode()
}

// upstreamKey is the key that replaces the configured upstream key for
// this request, or "" to use the configured one (or, with none, the
// client's own credentials as forwarded).
func (s *Server) upstreamKey(r *http.Request, tenant string) string {
	if k := r.Header.Get("X-Upstream-Api-Key"); k != "" && s.cfg.PassClientKey {
		return k
	}
	if len(s.cfg.Keys) == 0 {
		return ""
	}
	return s.cfg.UpstreamKeys[tenant]
}

// copyHeader returns the upstream's response headers to the client (request
// ids, rate limits, retry-after), less hop-by-hop ones and the length,
// which the gateway's own writer sets.
func copyHeader(dst, src http.Header) {
	for k, vs := range src {
		dst[k] = vs
	}
	dropHopByHop(dst)
	dst.Del("Content-Length")
}

// modelsWire says which wire a models request speaks: Anthropic clients
// send anthropic-version.
func modelsWire(r *http.Request) *wire.Dialect {
	if strings.HasPrefix(r.URL.Path, "/v1beta/") {
		return gemini.Dialect
	}
	if r.Header.Get("anthropic-version") != "" || r.Header.Get("x-api-key") != "" && r.Header.Get("Authorization") == "" {
		return anthropic.Dialect
	}
	return openai.Dialect
}

// models serves GET /v1/models and /v1/models/{id}: passed through to the
// upstream, merged across upstreams of the client's format when there are
// several.
func (s *Server) models(w http.ResponseWriter, r *http.Request, tenant string) {
	sh := modelsWire(r)
	var ups []*Upstream
	for _, u := range s.upstreams() {
		if u.Client.Format == upstream.Format(sh.Upstream) {
			ups = append(ups, u)
		}
	}
	if len(ups) == 0 {
		ups = s.upstreams()
	}
	if len(ups) == 0 {
		s.fail(w, sh, engine.ErrNoUpstream)
		return
	}
	if sh.ModelList == nil {
		ups = ups[:1] // a wire that pages its models its own way: the first upstream's, as it answers
	}
	if id := r.PathValue("id"); id != "" {
		if u, err := engine.Pick(s.upstreams(), sh, id); err == nil {
			ups = []*Upstream{u}
		} else {
			ups = ups[:1]
		}
	}
	req := upstream.Request{Method: http.MethodGet, Path: r.URL.Path, Query: s.forwardQuery(r), Header: s.forwardHeader(r), APIKey: s.upstreamKey(r, tenant)}
	if len(ups) == 1 {
		resp, err := ups[0].Client.Send(r.Context(), req)
		if err != nil {
			s.fail(w, sh, err)
			return
		}
		defer resp.Body.Close()
		copyHeader(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, io.LimitReader(resp.Body, 16<<20))
		return
	}
	var data []json.RawMessage
	for _, u := range ups {
		resp, err := u.Client.Send(r.Context(), req)
		if err != nil {
			s.fail(w, sh, err)
			return
		}
		var page struct {
			Data []json.RawMessage `json:"data"`
		}
		err = json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&page)
		resp.Body.Close()
		if err != nil {
			s.fail(w, sh, fmt.Errorf("upstream: %s: models: %w", u.Name, err))
			return
		}
		data = append(data, page.Data...)
	}
	if data == nil {
		data = []json.RawMessage{}
	}
	replyJSON(w, http.StatusOK, sh.ModelList(data))
}

// notFound answers an unknown route in the shape its client expects.
func (s *Server) notFound(w http.ResponseWriter, r *http.Request, _ string) {
	sh := openai.Dialect
	switch {
	case strings.HasPrefix(r.URL.Path, "/v1beta/"):
		sh = gemini.Dialect
	case strings.HasPrefix(r.URL.Path, "/v1/messages") || r.Header.Get("anthropic-version") != "":
		sh = anthropic.Dialect
	}
	writeError(w, sh, http.StatusNotFound, "not_found_error", "imgctx has no route "+r.Method+" "+r.URL.Path)
}
