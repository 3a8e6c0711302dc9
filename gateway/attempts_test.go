package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/prometheus/client_golang/prometheus"
)

// Every attempt at the upstream is counted, retries included, and a failed
// one is logged at WARN with its cause: two 503s then a 200 are three
// requests, two warnings.
func TestEveryUpstreamAttemptIsCountedAndAFailureLogged(t *testing.T) {
	var n atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if n.Add(1) <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"error":{"message":"overloaded, try again","type":"server_error"}}`)
			return
		}
		io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`)
	}))
	t.Cleanup(up.Close)
	tbl, _ := tokens.Default().With(tinyProfile)
	client := &upstream.Client{Format: upstream.OpenAI, BaseURL: up.URL, MaxRetries: 2, Sleep: func(context.Context, time.Duration) error { return nil }}
	e := &engine.Engine{Images: imagestore.Verified{Store: &imagestore.Mem{}}, Sessions: &session.Mem{}, Profiles: tbl, Upstream: client}
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	done := finish(New(Config{}, e, reg, slog.New(slog.NewJSONHandler(&logs, nil))))
	srv := httptest.NewServer(done)
	t.Cleanup(srv.Close)
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"tiny-1","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	done.wait() // the request's own line is written once its answer is the client's
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	mfs, _ := reg.Gather()
	counted := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "imgctx_upstream_requests_total" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "status" {
						counted[l.GetValue()] += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	if counted["Service Unavailable"] != 2 || counted["OK"] != 1 {
		t.Fatalf("upstream requests counted %v; want 2 Service Unavailable and 1 OK", counted)
	}
	if warn := strings.Count(logs.String(), `"level":"WARN","msg":"upstream attempt failed"`); warn != 2 || !strings.Contains(logs.String(), `"status":503`) || !strings.Contains(logs.String(), "overloaded") {
		t.Fatalf("%d warnings; want 2 with the status and the cause:\n%s", warn, logs.String())
	}
}

// One upstream of a drop-in-only format (gemini, the flat ones) serves its
// drop-in route with no config file; the sessions API, which calls openai
// or anthropic upstreams only, answers 501 naming what to do.
func TestASingleGeminiUpstreamServesItsRouteAndRefusesSessions(t *testing.T) {
	up, _, _, _ := newGeminiRig(t, 20_000, nil)
	tbl, _ := tokens.Default().With(agentProfile(20_000))
	e := &engine.Engine{Images: imagestore.Verified{Store: &imagestore.Mem{}}, Sessions: &session.Mem{}, Profiles: tbl,
		Upstream: &upstream.Client{Format: upstream.Gemini, BaseURL: up.srv.URL, MaxRetries: -1}}
	srv := httptest.NewServer(New(Config{}, e, prometheus.NewRegistry(), discardLogger()).Handler())
	t.Cleanup(srv.Close)
	up.mu.Lock()
	up.next = reply{}
	up.mu.Unlock()
	resp, err := http.Post(srv.URL+"/v1beta/models/agent-1:generateContent", "application/json", strings.NewReader(`{"contents":[{"role":"user","parts":[{"text":"hi"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("the Gemini route through the single gemini upstream: %d", resp.StatusCode)
	}
	resp, err = http.Post(srv.URL+"/v1/sessions", "application/json", strings.NewReader(`{"model":"agent-1"}`))
	if err != nil {
		t.Fatal(err)
	}
	var created struct{ ID string }
	json.NewDecoder(resp.Body).Decode(&created)
	resp.Body.Close()
	resp, err = http.Post(srv.URL+"/v1/sessions/"+created.ID+"/turn", "application/json", strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotImplemented || !bytes.Contains(b, []byte("drop-in route")) {
		t.Fatalf("a session turn over a gemini upstream: %d %s", resp.StatusCode, b)
	}
}

// fullStore refuses every write with what a full disk says: a path.
type fullStore struct{ imagestore.Mem }

func (*fullStore) Put(context.Context, string, blob.Ref, []byte) error {
	return errors.New("write /srv/imgctx-data/images/default/ab/abcdef.tmp: no space left on device")
}

// A refusal of the server's own (507 from the store, 500) tells the client
// what happened and an id, never the infrastructure's names: the path goes
// to the log, under the same id.
func TestServerFaultsNameNoInfrastructure(t *testing.T) {
	tbl, _ := tokens.Default().With(tinyProfile)
	e := &engine.Engine{Images: imagestore.Verified{Store: &fullStore{}}, Sessions: &session.Mem{}, Profiles: tbl}
	var logs bytes.Buffer
	done := finish(New(Config{}, e, prometheus.NewRegistry(), slog.New(slog.NewJSONHandler(&logs, nil))))
	srv := httptest.NewServer(done)
	t.Cleanup(srv.Close)
	raw, _ := samplePNG(t)
	resp, err := http.Post(srv.URL+"/v1/images", "image/png", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	done.wait()
	var answer struct {
		Error struct{ Message string } `json:"error"`
	}
	json.Unmarshal(b, &answer)
	id := ""
	if m := regexp.MustCompile(`\(error ([0-9a-f]{12});`).FindStringSubmatch(answer.Error.Message); m != nil {
		id = m[1]
	}
	if id == "" || resp.StatusCode != http.StatusInsufficientStorage || bytes.Contains(b, []byte("/srv/")) || !strings.HasPrefix(answer.Error.Message, "refused: Insufficient Storage") {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if !strings.Contains(logs.String(), `"error_id":"`+id+`"`) || !strings.Contains(logs.String(), "/srv/imgctx-data") {
		t.Fatalf("the log does not hold the cause under id %q:\n%s", id, logs.String())
	}
}

// Issue "Hardening, third pass", item 9: an upstream that cannot be
// reached is a 502 that names no host or port (a transport error carries
// them): the client gets what happened and an id, the log the cause.
func TestUnreachableUpstreamNamesNoHost(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	tbl, _ := tokens.Default().With(tinyProfile)
	e := &engine.Engine{Images: imagestore.Verified{Store: &imagestore.Mem{}}, Sessions: &session.Mem{}, Profiles: tbl,
		Upstream: &upstream.Client{Format: upstream.OpenAI, BaseURL: "http://" + addr, MaxRetries: -1}}
	var logs bytes.Buffer
	done := finish(New(Config{}, e, prometheus.NewRegistry(), slog.New(slog.NewJSONHandler(&logs, nil))))
	srv := httptest.NewServer(done)
	t.Cleanup(srv.Close)
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"tiny-1","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	done.wait()
	m := regexp.MustCompile(`\(error ([0-9a-f]{12});`).FindSubmatch(b)
	if resp.StatusCode != http.StatusBadGateway || m == nil || bytes.Contains(b, []byte(addr)) || bytes.Contains(b, []byte("127.0.0.1")) ||
		!bytes.Contains(b, []byte("could not be reached")) {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if !strings.Contains(logs.String(), `"error_id":"`+string(m[1])+`"`) || !strings.Contains(logs.String(), addr) {
		t.Fatalf("the log does not hold the cause under id %s:\n%s", m[1], logs.String())
	}
}

// Issue "Hardening, third pass", item 8: a tenant past its share of the
// image store gets a 507 naming the quota; another tenant's upload goes
// on.
func TestTenantQuotaIsNamedAndTheOthersGoOn(t *testing.T) {
	tbl, _ := tokens.Default().With(tinyProfile)
	raw, _ := samplePNG(t)
	q := &imagestore.Quota{Store: &imagestore.Mem{}, MaxBytes: int64(len(raw)) * 3 / 2} // one image each, not two
	e := &engine.Engine{Images: imagestore.Verified{Store: q}, Sessions: &session.Mem{}, Profiles: tbl}
	srv := httptest.NewServer(New(Config{Keys: map[string]string{"ka": "acme", "kb": "beta"}}, e, prometheus.NewRegistry(), discardLogger()).Handler())
	t.Cleanup(srv.Close)
	post := func(key string, data []byte) (int, string) {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/images", bytes.NewReader(data))
		req.Header.Set("Content-Type", "image/png")
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, b := post("ka", raw); code != 201 {
		t.Fatalf("acme's first image: %d %s", code, b)
	}
	if code, b := post("ka", distinctPNG(raw, 2)); code != http.StatusInsufficientStorage || !strings.Contains(b, "storage.tenant_max_bytes") {
		t.Fatalf("acme past its quota: %d %s", code, b)
	}
	if code, b := post("kb", distinctPNG(raw, 3)); code != 201 {
		t.Fatalf("beta's image while acme is full: %d %s", code, b)
	}
}
