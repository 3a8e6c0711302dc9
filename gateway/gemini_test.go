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
	"github.com/imgctx/imgctx/wire/gemini"
	"github.com/prometheus/client_golang/prometheus"
)

// geminiUpstream is a generateContent endpoint built from the API
// reference with encoding/json: it bills each request from its contents
// (10 tokens, 4 a content, text at four characters a token, function calls
// and responses by their JSON, each inlineData image by the test profile's
// rule), answers with a functionCall or text, as one response or as
// alt=sse chunks, usage in usageMetadata; countTokens answers totalTokens.
type geminiUpstream struct {
	t       testing.TB
	profile tokens.Profile
	srv     *httptest.Server

	mu     sync.Mutex
	bodies [][]byte
	paths  []string
	keys   []string
	images []int
	next   reply
}

func newGeminiUpstream(t testing.TB, p tokens.Profile) *geminiUpstream {
	u := &geminiUpstream{t: t, profile: p}
	u.srv = httptest.NewServer(http.HandlerFunc(u.handle))
	t.Cleanup(u.srv.Close)
	return u
}

type geminiPart struct {
	Text       string `json:"text"`
	InlineData *struct {
		MimeType string `json:"mimeType"`
		Data     string `json:"data"`
	} `json:"inlineData"`
	InlineDataSnake *struct {
		MimeType string `json:"mime_type"`
		Data     string `json:"data"`
	} `json:"inline_data"`
	FunctionCall     json.RawMessage `json:"functionCall"`
	FunctionResponse *struct {
		Name     string          `json:"name"`
		Response json.RawMessage `json:"response"`
		Parts    []geminiPart    `json:"parts"`
	} `json:"functionResponse"`
}

func (u *geminiUpstream) price(body []byte) (prompt, images int, err error) {
	var r struct {
		Contents []struct {
			Role  string       `json:"role"`
			Parts []geminiPart `json:"parts"`
		} `json:"contents"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return 0, 0, err
	}
	c := tokens.Chars4{}
	prompt = 10
	var parts func([]geminiPart) error
	parts = func(ps []geminiPart) error {
		for _, p := range ps {
			prompt += c.Count(p.Text) + c.Count(string(p.FunctionCall))
			if p.FunctionResponse != nil {
				prompt += c.Count(p.FunctionResponse.Name) + c.Count(string(p.FunctionResponse.Response))
				if err := parts(p.FunctionResponse.Parts); err != nil {
					return err
				}
			}
			if p.InlineData != nil && strings.HasPrefix(p.InlineData.MimeType, "image/") {
				data, err := base64.StdEncoding.DecodeString(p.InlineData.Data)
				if err != nil {
					return err
				}
				w, h, err := media.Dimensions(data, media.Limits{})
				if err != nil {
					return err
				}
				n, _ := tokens.ImageTokens(u.profile, w, h, "")
				images += n
			}
		}
		return nil
	}
	for _, ct := range r.Contents {
		prompt += tokens.MessageFraming
		if err := parts(ct.Parts); err != nil {
			return 0, 0, err
		}
	}
	return prompt + images, images, nil
}

func (u *geminiUpstream) handle(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // a request started early and cut off: never a request
	}
	prompt, images, err := u.price(body)
	if err != nil {
		u.t.Errorf("gemini upstream: a request off the documented shape: %v", err)
		w.WriteHeader(400)
		return
	}
	u.mu.Lock()
	u.bodies, u.paths, u.images = append(u.bodies, body), append(u.paths, r.URL.Path), append(u.images, images)
	u.keys = append(u.keys, r.Header.Get("x-goog-api-key")+"|"+r.URL.Query().Get("key"))
	next := u.next
	u.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if strings.HasSuffix(r.URL.Path, ":countTokens") {
		fmt.Fprintf(w, `{"totalTokens":%d}`, prompt)
		return
	}
	part := `{"text":"Done."}`
	if next.tools > 0 {
		part = `{"functionCall":{"name":"read_file","args":{"path":"screen.png"}}}`
	}
	usage := fmt.Sprintf(`"usageMetadata":{"promptTokenCount":%d,"candidatesTokenCount":7,"totalTokenCount":%d}`, prompt, prompt+7)
	final := `{"candidates":[{"content":{"role":"model","parts":[` + part + `]},"finishReason":"STOP","index":0}],` + usage + `,"modelVersion":"agent-1"}`
	if !strings.HasSuffix(r.URL.Path, ":streamGenerateContent") {
		io.WriteString(w, final)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, chunk := range []string{
		`{"candidates":[{"content":{"role":"model","parts":[{"text":"","thought":true,"thoughtSignature":"c2ln"}]},"index":0}],"modelVersion":"agent-1"}`,
		final,
	} {
		io.WriteString(w, "data: "+chunk+"\r\n\r\n")
		w.(http.Flusher).Flush()
	}
}

// geminiCLI drives a conversation as gemini-cli does: contents re-sent
// whole, the model's content appended as it came, a functionResponse
// carrying the screenshot as a nested inlineData part, countTokens between
// calls.
type geminiCLI struct {
	t        *testing.T
	url, key string
	header   map[string]string // sent on every call
	beside   bool              // the screenshot beside the functionResponse, not inside it
	contents []string
	sent     [][]byte
	bodies   [][]byte
	png      []byte
	shots    int
}

func (g *geminiCLI) body() []byte {
	return []byte(`{"contents":[` + strings.Join(g.contents, ",") + `],"systemInstruction":{"parts":[{"text":"You are Gemini CLI."}]},"generationConfig":{"temperature":0}}`)
}

func (g *geminiCLI) call(up *geminiUpstream, method string, next reply) []byte {
	g.t.Helper()
	up.mu.Lock()
	up.next = next
	up.mu.Unlock()
	q := ""
	if method == "streamGenerateContent" {
		q = "?alt=sse"
	}
	body := g.body()
	req, _ := http.NewRequest("POST", g.url+"/v1beta/models/agent-1:"+method+q, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("x-goog-api-key", g.key)
	for k, v := range g.header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		g.t.Fatalf("%s: %d %s", method, resp.StatusCode, b)
	}
	if method == "countTokens" {
		return b
	}
	up.mu.Lock()
	g.sent, g.bodies = append(g.sent, up.bodies[len(up.bodies)-1]), append(g.bodies, body)
	up.mu.Unlock()
	// The model's content: from the response, or the last chunk of the stream.
	final := b
	if method == "streamGenerateContent" {
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "data: "); ok {
				final = []byte(data)
			}
		}
	}
	var r struct {
		Candidates []struct {
			Content json.RawMessage `json:"content"`
		} `json:"candidates"`
	}
	json.Unmarshal(final, &r)
	g.contents = append(g.contents, string(r.Candidates[0].Content))
	return b
}

func (g *geminiCLI) user(text string) {
	g.contents = append(g.contents, fmt.Sprintf(`{"role":"user","parts":[{"text":%q}]}`, text))
}

func (g *geminiCLI) screenshot() {
	g.shots++
	data := base64.StdEncoding.EncodeToString(distinctPNG(g.png, g.shots))
	if g.beside {
		g.contents = append(g.contents, `{"role":"user","parts":[{"functionResponse":{"name":"read_file","response":{"output":"Binary content of type image/png was processed."}}},{"inlineData":{"mimeType":"image/png","data":"`+data+`"}}]}`)
		return
	}
	g.contents = append(g.contents, `{"role":"user","parts":[{"functionResponse":{"name":"read_file","response":{"output":"Read image file screen.png"},"parts":[{"inlineData":{"mimeType":"image/png","data":"`+data+`"}}]}}]}`)
}

// newGeminiRig returns the session store as the test reads it (settledStore).
func newGeminiRig(t *testing.T, window int, keys map[string]string) (*geminiUpstream, session.Store, *imagestore.Mem, string) {
	p := agentProfile(window)
	up, sessions, images := newGeminiUpstream(t, p), &session.Mem{}, &imagestore.Mem{}
	tbl, _ := tokens.Default().With(p)
	e := &engine.Engine{Images: imagestore.Verified{Store: images}, Sessions: sessions, Profiles: tbl}
	ups := []*Upstream{{Name: "gemini", Client: &upstream.Client{Format: upstream.Gemini, BaseURL: up.srv.URL, APIKey: "upstream-gemini-key", MaxRetries: -1}}}
	done := finish(New(Config{Keys: keys, MaxBodyBytes: 64 << 20, Upstreams: ups}, e, prometheus.NewRegistry(), discardLogger()))
	srv := httptest.NewServer(done)
	t.Cleanup(srv.Close)
	return up, settledStore{sessions, done}, images, srv.URL
}

// A gemini-cli-shaped session through the Gemini route, streamed and not:
// the screenshot nested in a functionResponse reaches the upstream byte
// for byte, stored once; countTokens between calls records nothing; the
// screenshot is kept at its billed cost; over the budget the next one is a
// marker (a text part) at the next turn; the gateway key never reaches
// the upstream, the upstream's does.
func TestGeminiCLISession(t *testing.T) {
	for _, method := range []string{"generateContent", "streamGenerateContent"} {
		t.Run(method, func(t *testing.T) {
			up, sessions, images, url := newGeminiRig(t, 20_000, map[string]string{"gw-key": "acme"}) // budget 2,000
			raw, _ := samplePNG(t)
			g := &geminiCLI{t: t, url: url, key: "gw-key", png: raw}
			g.user("Look at screen.png.")
			g.call(up, method, reply{tools: 1})
			g.screenshot()
			if b := g.call(up, "countTokens", reply{}); !bytes.Contains(b, []byte(`"totalTokens"`)) {
				t.Fatalf("countTokens: %s", b)
			}
			g.call(up, method, reply{tools: 1})
			if !bytes.Equal(g.sent[1], g.bodies[1]) {
				t.Fatal("the functionResponse's screenshot did not reach the upstream byte for byte")
			}
			g.screenshot()
			g.call(up, method, reply{})
			n := 0
			images.List(t.Context(), "acme", func(imagestore.Info) error { n++; return nil })
			if n != 2 {
				t.Fatalf("%d images stored; want 2", n)
			}
			sp, err := gemini.Scan(g.body(), wire.ScanOptions{})
			if err != nil {
				t.Fatal(err)
			}
			d, err := sessions.LoadProxied(context.Background(), "acme", engine.ConversationKey("acme", gemini.Dialect, http.Header{}, sp))
			if err != nil || len(d.Images) != 2 || d.Images[0].Keep != chat.Kept || d.Images[0].Cost != 1334 {
				t.Fatalf("decisions %+v %v; want the first kept at the billed 1334", d.Images, err)
			}
			g.user("And now?")
			g.call(up, method, reply{})
			last := g.sent[len(g.sent)-1]
			if bytes.Count(last, []byte(`"inlineData"`)) != 1 || !bytes.Contains(last, []byte(`{"text":"[image removed]"}`)) {
				t.Fatal("the next turn does not carry the ephemeral screenshot's marker")
			}
			for _, k := range up.keys {
				if k != "upstream-gemini-key|" {
					t.Fatalf("the upstream got credentials %q", k)
				}
			}
		})
	}
}

// A screenshot beside its functionResponse (the other shape gemini-cli
// sends) is the tool's too: with keep-turn-images off it is shown during
// its turn only, as a screenshot nested in the functionResponse is (a
// user's image would stay).
func TestGeminiScreenshotBesideTheFunctionResponseIsTheTools(t *testing.T) {
	up, _, _, url := newGeminiRig(t, 200_000, map[string]string{"gw-key": "acme"})
	raw, _ := samplePNG(t)
	g := &geminiCLI{t: t, url: url, key: "gw-key", png: raw, beside: true, header: map[string]string{"X-Imgctx-Keep-Turn-Images": "off"}}
	g.user("Look at the screen.")
	g.call(up, "generateContent", reply{tools: 1})
	g.screenshot()
	g.call(up, "generateContent", reply{tools: 1})
	if n := bytes.Count(g.sent[1], []byte(`"inlineData"`)); n != 1 {
		t.Fatalf("the screenshot's request carries %d images", n)
	}
	g.call(up, "generateContent", reply{}) // the tool answered: the turn ends
	g.user("Next page.")
	g.call(up, "generateContent", reply{})
	if last := g.sent[3]; bytes.Count(last, []byte(`"inlineData"`)) != 0 || !bytes.Contains(last, []byte(`{"text":"[image removed]"}`)) {
		t.Fatalf("the screenshot outlived its turn: %d images in the next turn's request", bytes.Count(last, []byte(`"inlineData"`)))
	}
}

// Errors come back in Google's shape; an unknown method is a 404 there.
func TestGeminiErrorsInGooglesShape(t *testing.T) {
	_, _, _, url := newGeminiRig(t, 20_000, map[string]string{"gw-key": "acme"})
	for _, c := range []struct {
		path, key string
		status    int
		want      string
	}{
		{"/v1beta/models/agent-1:generateContent", "", 401, `"status":"UNAUTHENTICATED"`},
		{"/v1beta/models/agent-1:generateContent?key=gw-key", "", 400, `"status":"INVALID_ARGUMENT"`}, // key= works; the body is bad
		{"/v1beta/models/agent-1:embedContent", "gw-key", 404, `"status":"NOT_FOUND"`},
	} {
		req, _ := http.NewRequest("POST", url+c.path, strings.NewReader(`{"contents":[{"role":"user","parts":[{"inlineData":{"mimeType":"image/png","data":"@@@@"}}]}]}`))
		if c.key != "" {
			req.Header.Set("x-goog-api-key", c.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || !bytes.Contains(b, []byte(c.want)) {
			t.Errorf("%s: %d %s", c.path, resp.StatusCode, b)
		}
	}
}

// An image over the provider's edge goes shrunk on Gemini's wire too: an
// inlineData of the smaller copy where the original was, the resize note
// as a text part after it, the same bytes on every request.
func TestGeminiShrunkImageCarriesAResizeNote(t *testing.T) {
	p := agentProfile(200_000)
	p.Limits = tokens.Limits{MaxEdge: 400}
	up := newGeminiUpstream(t, p)
	tbl, _ := tokens.Default().With(p)
	e := &engine.Engine{Images: imagestore.Verified{Store: &imagestore.Mem{}}, Sessions: &session.Mem{}, Profiles: tbl, Shrinker: &media.Shrinker{}}
	ups := []*Upstream{{Name: "gemini", Client: &upstream.Client{Format: upstream.Gemini, BaseURL: up.srv.URL, APIKey: "k", MaxRetries: -1}}}
	s := New(Config{MaxBodyBytes: 64 << 20, Upstreams: ups}, e, prometheus.NewRegistry(), discardLogger())
	t.Cleanup(s.Close)
	srv := httptest.NewServer(finish(s))
	t.Cleanup(srv.Close)
	_, b64 := samplePNG(t)
	body := `{"contents":[{"role":"user","parts":[{"text":"click the button"},{"inlineData":{"mimeType":"image/png","data":"` + b64 + `"}}]}]}`
	for range 2 {
		resp, err := http.Post(srv.URL+"/v1beta/models/agent-1:generateContent", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, answer)
		}
	}
	up.mu.Lock()
	got := up.bodies
	up.mu.Unlock()
	var sent struct {
		Contents []struct{ Parts []geminiPart } `json:"contents"`
	}
	if err := json.Unmarshal(got[0], &sent); err != nil || len(sent.Contents) != 1 || len(sent.Contents[0].Parts) != 3 {
		t.Fatalf("want the text, the image and its note: %v\n%.300s", err, got[0])
	}
	parts := sent.Contents[0].Parts
	if parts[1].InlineData == nil || parts[1].InlineData.Data == b64 {
		t.Fatalf("the original went, or no inlineData: %.300s", got[0])
	}
	shrunk, err := base64.StdEncoding.DecodeString(parts[1].InlineData.Data)
	if err != nil {
		t.Fatal(err)
	}
	info, err := media.Inspect(shrunk, parts[1].InlineData.MimeType, media.Limits{})
	if err != nil || info.Width != 400 || info.Height != 250 || info.MediaType != parts[1].InlineData.MimeType {
		t.Fatalf("the copy sent: %+v (%v) as %s; want a 400x250 image of its MIME type", info, err, parts[1].InlineData.MimeType)
	}
	if want := "[imgctx: the image above was resized from 1280x800 to 400x250 to meet the provider's limits; multiply its coordinates by 3.2 to get coordinates in the original]"; parts[2].Text != want {
		t.Fatalf("the note after it: %q", parts[2].Text)
	}
	if !bytes.Equal(got[0], got[1]) {
		t.Fatal("the shrunk request differs between two identical requests")
	}
}
