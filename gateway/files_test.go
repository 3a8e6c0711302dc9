package gateway

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/prometheus/client_golang/prometheus"
)

// fileProvider is a model server with a Files API, built to the providers'
// documented shapes: Anthropic (POST /v1/files multipart under the
// files-api beta; a source {"type":"file"}; not_found_error for a file it
// does not have), OpenAI (POST /v1/files multipart with a purpose;
// input_image file_id on /v1/responses; 404 "No such File object"),
// Gemini (the resumable upload in two calls; fileData.fileUri; 403
// PERMISSION_DENIED for a file gone). A file belongs to the credential that
// uploaded it: another credential naming it is refused as a missing file.
type fileProvider struct {
	format upstream.Format
	srv    *httptest.Server
	mu     sync.Mutex
	files  map[string]providerFile // by id
	next   int
	// uploads counts upload calls by image digest (failed ones too);
	// deletes the DELETE calls.
	uploads map[string]int
	deletes []string
	bodies  [][]byte
	// refuse answers uploads with this status (0: none), refuseDeletes
	// deletes.
	refuse, refuseDeletes int
	// session holds Gemini's upload sessions: URL path to what was started.
	session map[string]string
}

type providerFile struct {
	owner, digest, mediaType string
}

func newFileProvider(t *testing.T, format upstream.Format) *fileProvider {
	p := &fileProvider{format: format, files: map[string]providerFile{}, uploads: map[string]int{}, session: map[string]string{}}
	p.srv = httptest.NewServer(http.HandlerFunc(p.handle))
	t.Cleanup(p.srv.Close)
	return p
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return fmt.Sprintf("%x", s[:8])
}

// owner is the request's credential as the provider reads it.
func owner(r *http.Request) string {
	for _, h := range []string{"X-Api-Key", "Authorization", "X-Goog-Api-Key"} {
		if v := r.Header.Get(h); v != "" {
			return v
		}
	}
	return r.URL.Query().Get("key")
}

func (p *fileProvider) handle(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/files":
		p.multipartUpload(w, r, body)
	case r.Method == http.MethodPost && r.URL.Path == "/upload/v1beta/files":
		if r.Header.Get("X-Goog-Upload-Protocol") != "resumable" || r.Header.Get("X-Goog-Upload-Command") != "start" {
			http.Error(w, "not a resumable start", 400)
			return
		}
		id := fmt.Sprintf("s%d", len(p.session))
		p.session["/upload/session/"+id] = r.Header.Get("X-Goog-Upload-Header-Content-Type")
		w.Header().Set("X-Goog-Upload-Url", p.srv.URL+"/upload/session/"+id)
		w.WriteHeader(200)
	case r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/upload/session/"):
		mt, ok := p.session[r.URL.Path]
		if !ok || r.Header.Get("X-Goog-Upload-Command") != "upload, finalize" {
			http.Error(w, "no such upload session", 404)
			return
		}
		p.uploads[digest(body)]++
		if p.refuse != 0 {
			w.WriteHeader(p.refuse)
			if p.refuse == 429 {
				io.WriteString(w, `{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}`)
			} else {
				io.WriteString(w, `{"error":{"code":500,"message":"Internal error encountered.","status":"INTERNAL"}}`)
			}
			return
		}
		id := p.store(owner(r), digest(body), mt)
		fmt.Fprintf(w, `{"file":{"name":"files/%s","mimeType":%q,"uri":"%s/v1beta/files/%s","state":"ACTIVE","expirationTime":%q}}`,
			id, mt, p.srv.URL, id, time.Now().Add(48*time.Hour).UTC().Format(time.RFC3339Nano))
	case r.Method == http.MethodDelete:
		id := r.URL.Path[strings.LastIndexByte(r.URL.Path, '/')+1:]
		p.deletes = append(p.deletes, id)
		if p.refuseDeletes != 0 {
			w.WriteHeader(p.refuseDeletes)
			return
		}
		if f, ok := p.files[id]; !ok || f.owner != owner(r) {
			w.WriteHeader(404)
			return
		}
		delete(p.files, id)
		fmt.Fprintf(w, `{"id":%q,"deleted":true}`, id)
	default:
		p.bodies = append(p.bodies, body)
		p.generate(w, r, body)
	}
}

func (p *fileProvider) store(owner, digest, mediaType string) string {
	p.next++
	id := fmt.Sprintf("file%04d", p.next)
	p.files[id] = providerFile{owner: owner, digest: digest, mediaType: mediaType}
	return id
}

func (p *fileProvider) multipartUpload(w http.ResponseWriter, r *http.Request, body []byte) {
	if p.format == upstream.Anthropic && !strings.Contains(r.Header.Get("Anthropic-Beta"), anthropic.FilesBeta) {
		http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"the Files API needs the files-api beta"}}`, 400)
		return
	}
	_, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil {
		http.Error(w, "not multipart", 400)
		return
	}
	form, err := multipart.NewReader(bytes.NewReader(body), params["boundary"]).ReadForm(32 << 20)
	if err != nil || len(form.File["file"]) != 1 {
		http.Error(w, "no file part", 400)
		return
	}
	if p.format == upstream.OpenAI && (len(form.Value["purpose"]) != 1 || form.Value["purpose"][0] != "vision") {
		http.Error(w, `{"error":{"message":"purpose must be vision","type":"invalid_request_error"}}`, 400)
		return
	}
	fh := form.File["file"][0]
	f, _ := fh.Open()
	data, _ := io.ReadAll(f)
	p.uploads[digest(data)]++
	if p.refuse != 0 {
		w.WriteHeader(p.refuse)
		if p.refuse == 429 {
			io.WriteString(w, `{"error":{"type":"rate_limit_error","message":"storage quota exceeded"}}`)
		} else {
			io.WriteString(w, `{"error":{"type":"api_error","message":"Internal server error"}}`)
		}
		return
	}
	id := p.store(owner(r), digest(data), fh.Header.Get("Content-Type"))
	if p.format == upstream.OpenAI {
		id = "file-" + id
		p.files[id] = p.files[strings.TrimPrefix(id, "file-")]
		delete(p.files, strings.TrimPrefix(id, "file-"))
		fmt.Fprintf(w, `{"id":%q,"object":"file","bytes":%d,"created_at":%d,"expires_at":%d,"filename":%q,"purpose":"vision"}`,
			id, len(data), time.Now().Unix(), time.Now().Add(7*24*time.Hour).Unix(), fh.Filename)
		return
	}
	fmt.Fprintf(w, `{"id":%q,"type":"file","filename":%q,"mime_type":%q,"size_bytes":%d,"created_at":%q,"downloadable":false}`,
		id, fh.Filename, fh.Header.Get("Content-Type"), len(data), time.Now().UTC().Format(time.RFC3339))
}

var (
	anthropicFileRef = regexp.MustCompile(`"source":\{"type":"file","file_id":"([^"]+)"\}`)
	responsesFileRef = regexp.MustCompile(`"file_id":"([^"]+)"`)
	geminiFileRef    = regexp.MustCompile(`"fileUri":"[^"]*/v1beta/files/([^"]+)"`)
)

// generate answers a model request, refusing one that names a file the
// caller's credential does not have, as each provider does.
func (p *fileProvider) generate(w http.ResponseWriter, r *http.Request, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	var refs *regexp.Regexp
	switch p.format {
	case upstream.Anthropic:
		refs = anthropicFileRef
	case upstream.OpenAI:
		refs = responsesFileRef
	default:
		refs = geminiFileRef
	}
	for _, m := range refs.FindAllSubmatch(body, -1) {
		id := string(m[1])
		if p.format == upstream.Anthropic && !strings.Contains(r.Header.Get("Anthropic-Beta"), anthropic.FilesBeta) {
			w.WriteHeader(400)
			io.WriteString(w, `{"type":"error","error":{"type":"invalid_request_error","message":"file sources need the files-api beta"}}`)
			return
		}
		if f, ok := p.files[id]; ok && f.owner == owner(r) {
			continue
		}
		switch p.format {
		case upstream.Anthropic:
			w.WriteHeader(404)
			fmt.Fprintf(w, `{"type":"error","error":{"type":"not_found_error","message":"File not found: %s"}}`, id)
		case upstream.OpenAI:
			w.WriteHeader(404)
			fmt.Fprintf(w, `{"error":{"message":"No such File object: %s","type":"invalid_request_error","param":"file_id","code":null}}`, id)
		default:
			w.WriteHeader(403)
			fmt.Fprintf(w, `{"error":{"code":403,"message":"You do not have permission to access the File %s or it may not exist.","status":"PERMISSION_DENIED"}}`, id)
		}
		return
	}
	switch p.format {
	case upstream.Anthropic:
		io.WriteString(w, `{"id":"m1","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":100,"output_tokens":2}}`)
	case upstream.OpenAI:
		io.WriteString(w, `{"id":"resp_1","object":"response","status":"completed","model":"gpt-4o","output":[{"type":"message","id":"msg_1","role":"assistant","status":"completed","content":[{"type":"output_text","text":"ok","annotations":[]}]}],"usage":{"input_tokens":100,"output_tokens":2,"total_tokens":102}}`)
	default:
		io.WriteString(w, `{"candidates":[{"content":{"role":"model","parts":[{"text":"ok"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":100,"candidatesTokenCount":2,"totalTokenCount":102}}`)
	}
}

// lose forgets every file holding img, as a provider does one it
// deleted or let expire.
func (p *fileProvider) lose(img []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id, f := range p.files {
		if f.digest == digest(img) {
			delete(p.files, id)
		}
	}
}

func (p *fileProvider) uploadCounts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for k, v := range p.uploads {
		out[k] = v
	}
	return out
}

func (p *fileProvider) received() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([][]byte(nil), p.bodies...)
}

// filesEngine is the files tests' engine over its stores: another
// process's over the same stores is another filesEngine of them.
func filesEngine(images imagestore.Store, sessions session.Store) *engine.Engine {
	return &engine.Engine{Images: images, Sessions: sessions, Profiles: tokens.Default(),
		Fetcher:  &media.Fetcher{Timeout: 2 * time.Second, AnyPort: true, Log: discardLogger()},
		Shrinker: &media.Shrinker{}}
}

// filesGW is a gateway whose one upstream is p, with file_ids auto (or
// not), passing the client's own credentials; given an engine, it serves
// with that one (another gateway over the same conversations).
func filesGW(t *testing.T, p *fileProvider, files bool, e ...*engine.Engine) *gw {
	g := &gw{images: &imagestore.Mem{}}
	g.engine = filesEngine(imagestore.Verified{Store: g.images}, &session.Mem{})
	if len(e) > 0 {
		g.engine = e[0]
	}
	route := &Upstream{Name: "p", Client: &upstream.Client{Format: p.format, BaseURL: p.srv.URL, MaxRetries: -1}, Files: files}
	g.serve(t, New(Config{MaxBodyBytes: 64 << 20, Upstreams: []*Upstream{route}}, g.engine, prometheus.NewRegistry(), discardLogger()))
	return g
}

// filesWire is one wire's conversation as the test's client writes it:
// the request body with the images of the first n turns, each image as
// base64 or, given ids, as the file the provider holds for it.
type filesWire struct {
	name   string
	format upstream.Format
	path   string
	cred   []string // header and value
	body   func(images [][]byte, ids map[string]string) []byte
}

func fileWires() []filesWire {
	b64 := base64.StdEncoding.EncodeToString
	return []filesWire{
		{name: "anthropic", format: upstream.Anthropic, path: "/v1/messages", cred: []string{"X-Api-Key", "sk-ant-one", "Anthropic-Version", "2023-06-01"},
			body: func(images [][]byte, ids map[string]string) []byte {
				var msgs []string
				for i, img := range images {
					src := fmt.Sprintf(`{"type":"base64","media_type":"image/png","data":"%s"}`, b64(img))
					if id, ok := ids[digest(img)]; ok {
						src = fmt.Sprintf(`{"type":"file","file_id":"%s"}`, id)
					}
					msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":[{"type":"text","text":"step %d"},{"type":"image","source":%s}]}`, i, src))
					if i < len(images)-1 {
						msgs = append(msgs, fmt.Sprintf(`{"role":"assistant","content":[{"type":"text","text":"done %d"}]}`, i))
					}
				}
				return []byte(`{"model":"claude-sonnet-4-6","max_tokens":100,"messages":[` + strings.Join(msgs, ",") + `]}`)
			}},
		{name: "responses", format: upstream.OpenAI, path: "/v1/responses", cred: []string{"Authorization", "Bearer sk-one"},
			body: func(images [][]byte, ids map[string]string) []byte {
				var items []string
				for i, img := range images {
					src := fmt.Sprintf(`"image_url":"data:image/png;base64,%s"`, b64(img))
					if id, ok := ids[digest(img)]; ok {
						src = fmt.Sprintf(`"file_id":"%s"`, id)
					}
					items = append(items, fmt.Sprintf(`{"role":"user","content":[{"type":"input_text","text":"step %d"},{"type":"input_image",%s,"detail":"auto"}]}`, i, src))
					if i < len(images)-1 {
						items = append(items, fmt.Sprintf(`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done %d"}]}`, i))
					}
				}
				return []byte(`{"model":"gpt-4o","input":[` + strings.Join(items, ",") + `]}`)
			}},
		{name: "gemini", format: upstream.Gemini, path: "/v1beta/models/gemini-2.5-flash:generateContent", cred: []string{"X-Goog-Api-Key", "AIza-one"},
			body: func(images [][]byte, ids map[string]string) []byte {
				var cs []string
				for i, img := range images {
					part := fmt.Sprintf(`{"inlineData":{"mimeType":"image/png","data":"%s"}}`, b64(img))
					if id, ok := ids[digest(img)]; ok {
						part = fmt.Sprintf(`{"fileData":{"mimeType":"image/png","fileUri":"%s"}}`, id)
					}
					cs = append(cs, fmt.Sprintf(`{"role":"user","parts":[{"text":"step %d"},%s]}`, i, part))
					if i < len(images)-1 {
						cs = append(cs, fmt.Sprintf(`{"role":"model","parts":[{"text":"done %d"}]}`, i))
					}
				}
				return []byte(`{"contents":[` + strings.Join(cs, ",") + `]}`)
			}},
	}
}

// ids maps each image the provider holds for cred to how the wire names
// it: the id, or Gemini's URI.
func (p *fileProvider) ids(cred string) map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]string{}
	for id, f := range p.files {
		if f.owner != cred {
			continue
		}
		if p.format == upstream.Gemini {
			out[f.digest] = p.srv.URL + "/v1beta/files/" + id
		} else {
			out[f.digest] = id
		}
	}
	return out
}

func shots(t *testing.T, n int) [][]byte {
	png, _ := samplePNG(t)
	out := make([][]byte, n)
	for i := range out {
		out[i] = distinctPNG(png, 9000+i)
	}
	return out
}

// Through the gateway with file_ids auto, a 30-request conversation on
// each wire uploads each image exactly once; every upstream body is the
// client's with each image named by its file, and nothing else changed; a
// file the provider deleted is uploaded again and the request succeeds.
func TestFileIDsUploadEachImageOnce(t *testing.T) {
	for _, fw := range fileWires() {
		t.Run(fw.name, func(t *testing.T) {
			p := newFileProvider(t, fw.format)
			g := filesGW(t, p, true)
			imgs := shots(t, 30)
			cred := fw.cred[1]
			for n := 1; n <= 30; n++ {
				resp, out := g.do(t, "POST", fw.path, "", fw.body(imgs[:n], nil), fw.cred...)
				if resp.StatusCode != 200 {
					t.Fatalf("request %d: %d %s", n, resp.StatusCode, out)
				}
				bodies := p.received()
				got := bodies[len(bodies)-1]
				if want := fw.body(imgs[:n], p.ids(cred)); !bytes.Equal(got, want) {
					t.Fatalf("request %d: the upstream body is not the client's with file references:\n got %.600s\nwant %.600s", n, got, want)
				}
				if n == 20 {
					// The provider loses a file (deleted, expired): the next
					// request names it, is refused, and is replayed with it
					// uploaded again.
					p.lose(imgs[3])
				}
			}
			ups := p.uploadCounts()
			for i, img := range imgs {
				want := 1
				if i == 3 {
					want = 2 // once more after the provider lost it
				}
				if ups[digest(img)] != want {
					t.Errorf("image %d uploaded %d times, want %d", i, ups[digest(img)], want)
				}
			}
			if len(p.received()) != 31 {
				t.Errorf("%d model requests reached the provider, want 31 (30 and one replay)", len(p.received()))
			}
			if m := metric(t, g, "imgctx_provider_files_total"); !strings.Contains(m, `event="uploaded"} 31`) || !strings.Contains(m, `event="missing"} 1`) {
				t.Errorf("metrics:\n%s", m)
			}
		})
	}
}

// Turning file_ids on in a conversation whose images the provider's cache
// holds as base64 keeps them so: the next body starts with the bytes the
// previous one sent, and only the new image goes by file id.
func TestFileIDsKeepTheCachedPrefix(t *testing.T) {
	for _, fw := range fileWires() {
		t.Run(fw.name, func(t *testing.T) {
			p := newFileProvider(t, fw.format)
			g := filesGW(t, p, false)
			imgs := shots(t, 6)
			for n := 1; n <= 4; n++ {
				if resp, out := g.do(t, "POST", fw.path, "", fw.body(imgs[:n], nil), fw.cred...); resp.StatusCode != 200 {
					t.Fatalf("%d %s", resp.StatusCode, out)
				}
			}
			g = filesGW(t, p, true, g.engine) // file_ids turned on
			for n := 5; n <= 6; n++ {
				if resp, out := g.do(t, "POST", fw.path, "", fw.body(imgs[:n], nil), fw.cred...); resp.StatusCode != 200 {
					t.Fatalf("%d %s", resp.StatusCode, out)
				}
			}
			bodies := p.received()
			before, after := bodies[3], bodies[4]
			prefix := fw.body(imgs[:4], nil)
			prefix = prefix[:bytes.LastIndex(prefix, []byte("]"))] // the messages so far, without the closing brackets
			if !bytes.HasPrefix(before, prefix) || !bytes.HasPrefix(after, prefix) {
				t.Fatalf("the fifth body does not start with the fourth's messages as they were sent")
			}
			ups := p.uploadCounts()
			for i, img := range imgs {
				if want := map[bool]int{true: 1, false: 0}[i >= 4]; ups[digest(img)] != want {
					t.Errorf("image %d uploaded %d times, want %d", i, ups[digest(img)], want)
				}
			}
			ids := p.ids(fw.cred[1])
			if want := fw.body(imgs[:6], map[string]string{digest(imgs[4]): ids[digest(imgs[4])], digest(imgs[5]): ids[digest(imgs[5])]}); !bytes.Equal(bodies[5], want) {
				t.Fatalf("the sixth body:\n got %.400s\nwant %.400s", bodies[5], want)
			}
		})
	}
}

// Two credentials never share a file: the same image sent with each is
// uploaded once for each, and each request names its own credential's.
func TestFileIDsNeverCrossCredentials(t *testing.T) {
	fw := fileWires()[0]
	p := newFileProvider(t, fw.format)
	g := filesGW(t, p, true)
	img := shots(t, 1)
	for _, key := range []string{"sk-ant-one", "sk-ant-two", "sk-ant-one"} {
		if resp, out := g.do(t, "POST", fw.path, "", fw.body(img, nil), "X-Api-Key", key, "Anthropic-Version", "2023-06-01"); resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", key, resp.StatusCode, out)
		}
	}
	if n := p.uploadCounts()[digest(img[0])]; n != 2 {
		t.Fatalf("uploaded %d times for two credentials, want 2", n)
	}
	one, two := p.ids("sk-ant-one")[digest(img[0])], p.ids("sk-ant-two")[digest(img[0])]
	bodies := p.received()
	if one == two || !bytes.Contains(bodies[0], []byte(one)) || !bytes.Contains(bodies[1], []byte(two)) || !bytes.Contains(bodies[2], []byte(one)) {
		t.Fatalf("ids %q %q; bodies name %s / %s / %s", one, two, anthropicFileRef.Find(bodies[0]), anthropicFileRef.Find(bodies[1]), anthropicFileRef.Find(bodies[2]))
	}
}

// Many requests at once with the same new image upload it once.
func TestFileIDsConcurrentRequestsUploadOnce(t *testing.T) {
	fw := fileWires()[0]
	p := newFileProvider(t, fw.format)
	g := filesGW(t, p, true)
	img := shots(t, 1)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			// Each its own conversation, the same image.
			body := bytes.Replace(fw.body(img, nil), []byte("step 0"), fmt.Appendf(nil, "step 0 of client %d", i), 1)
			if resp, out := g.do(t, "POST", fw.path, "", body, fw.cred...); resp.StatusCode != 200 {
				t.Errorf("%d %s", resp.StatusCode, out)
			}
		})
	}
	wg.Wait()
	if n := p.uploadCounts()[digest(img[0])]; n != 1 {
		t.Fatalf("uploaded %d times by 8 concurrent requests, want 1", n)
	}
}

// An upload that fails sends the image as base64, and the request
// succeeds; a quota error, or an upstream with no Files API (404), turns
// uploads off for the credential for a while (no upload tried), counted.
// An answer that names no file (200 with an error's body) is a failure
// like a 500. On every wire with a Files API.
func TestFileIDsFailureFallsBackToBase64(t *testing.T) {
	for _, fw := range fileWires() {
		for _, status := range []int{500, 429, 404, 200} {
			t.Run(fmt.Sprint(fw.name, " ", status), func(t *testing.T) {
				p := newFileProvider(t, fw.format)
				p.refuse = status
				g := filesGW(t, p, true)
				imgs := shots(t, 2)
				for n := 1; n <= 2; n++ {
					resp, out := g.do(t, "POST", fw.path, "", fw.body(imgs[:n], nil), fw.cred...)
					if resp.StatusCode != 200 {
						t.Fatalf("request %d: %d %s", n, resp.StatusCode, out)
					}
					if got := p.received()[n-1]; !bytes.Equal(got, fw.body(imgs[:n], nil)) {
						t.Fatalf("request %d did not go as the client sent it: %.300s", n, got)
					}
				}
				tries := p.uploadCounts()
				m := metric(t, g, "imgctx_provider_files_total")
				if status == 429 || status == 404 {
					// The first upload met the quota, or found no Files API:
					// nothing tried after it.
					if tries[digest(imgs[0])] != 1 || tries[digest(imgs[1])] != 0 || !strings.Contains(m, `event="off"} 1`) {
						t.Fatalf("uploads tried %v; metrics:\n%s", tries, m)
					}
					return
				}
				if tries[digest(imgs[0])] != 2 || tries[digest(imgs[1])] != 1 || !strings.Contains(m, `event="fallback"} 3`) {
					t.Fatalf("uploads tried %v; metrics:\n%s", tries, m)
				}
			})
		}
	}
}

// The sweep deletes at the provider the files no conversation used within
// the idle expiry, with the credential they were uploaded with, and
// forgets them; a file still in use stays.
func TestFileIDsSweepDeletesStaleFiles(t *testing.T) {
	for _, fw := range fileWires() {
		t.Run(fw.name, func(t *testing.T) {
			p := newFileProvider(t, fw.format)
			g := filesGW(t, p, true)
			imgs := shots(t, 2)
			if resp, out := g.do(t, "POST", fw.path, "", fw.body(imgs, nil), fw.cred...); resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, out)
			}
			if n, left, err := g.engine.SweepFiles(t.Context(), time.Hour, g.server.Routes()); err != nil || n != 0 || left != 0 {
				t.Fatalf("files in use swept: %d %d %v", n, left, err)
			}
			g.engine.Now = func() time.Time { return time.Now().Add(3 * time.Hour) }
			n, left, err := g.engine.SweepFiles(t.Context(), time.Hour, g.server.Routes())
			if err != nil || n != 2 || left != 0 {
				t.Fatalf("swept %d, left %d: %v", n, left, err)
			}
			if len(p.ids(fw.cred[1])) != 0 || len(p.deletes) != 2 {
				t.Fatalf("the provider still holds %v; deletes %v", p.ids(fw.cred[1]), p.deletes)
			}
			if stale, _ := g.engine.Sessions.StaleFiles(t.Context(), time.Now().Add(time.Hour*24)); len(stale) != 0 {
				t.Fatalf("the store still lists %+v", stale)
			}
		})
	}
}

// A file the provider would not delete is left, counted, and deleted at
// the next sweep once it does; a file past the expiry the provider gave
// it is forgotten without a call — nothing is lost track of either way.
func TestFileIDsSweepRetriesAndForgetsExpired(t *testing.T) {
	for _, fw := range fileWires() {
		t.Run(fw.name, func(t *testing.T) {
			p := newFileProvider(t, fw.format)
			g := filesGW(t, p, true)
			if resp, out := g.do(t, "POST", fw.path, "", fw.body(shots(t, 2), nil), fw.cred...); resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, out)
			}
			later := time.Now().Add(3 * time.Hour)
			g.engine.Now = func() time.Time { return later }
			p.mu.Lock()
			p.refuseDeletes = http.StatusServiceUnavailable
			p.mu.Unlock()
			if n, left, err := g.engine.SweepFiles(t.Context(), time.Hour, g.server.Routes()); err != nil || n != 0 || left != 2 {
				t.Fatalf("the provider refusing: swept %d, left %d: %v", n, left, err)
			}
			if stale, _ := g.engine.Sessions.StaleFiles(t.Context(), later); len(stale) != 2 || len(p.ids(fw.cred[1])) != 2 {
				t.Fatalf("files the provider kept were forgotten: the store lists %d, the provider holds %d", len(stale), len(p.ids(fw.cred[1])))
			}
			p.mu.Lock()
			p.refuseDeletes = 0
			p.mu.Unlock()
			if n, left, err := g.engine.SweepFiles(t.Context(), time.Hour, g.server.Routes()); err != nil || n != 2 || left != 0 || len(p.ids(fw.cred[1])) != 0 {
				t.Fatalf("the next sweep: swept %d, left %d (%v); the provider holds %v", n, left, err, p.ids(fw.cred[1]))
			}

			// Gemini's files expire after 48 hours at the provider.
			if fw.format != upstream.Gemini {
				return
			}
			if resp, out := g.do(t, "POST", fw.path, "", fw.body(shots(t, 3)[2:], nil), fw.cred...); resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, out)
			}
			deletes := len(p.deletes)
			later = later.Add(49 * time.Hour)
			if n, left, err := g.engine.SweepFiles(t.Context(), time.Hour, g.server.Routes()); err != nil || n != 1 || left != 0 || len(p.deletes) != deletes {
				t.Fatalf("an expired file: swept %d, left %d (%v), %d delete calls", n, left, err, len(p.deletes)-deletes)
			}
			if stale, _ := g.engine.Sessions.StaleFiles(t.Context(), later.Add(time.Hour)); len(stale) != 0 {
				t.Fatalf("the store still lists %+v", stale)
			}
		})
	}
}

// Files uploaded by one process are the next one's: a gateway restarted
// (or another replica) over the same session store sends the images by
// the same file ids and uploads none of them again.
func TestFileIDsOutliveTheProcess(t *testing.T) {
	for _, fw := range fileWires() {
		t.Run(fw.name, func(t *testing.T) {
			p := newFileProvider(t, fw.format)
			g := filesGW(t, p, true)
			imgs := shots(t, 2)
			send := func(g *gw) []byte {
				t.Helper()
				if resp, out := g.do(t, "POST", fw.path, "", fw.body(imgs, nil), fw.cred...); resp.StatusCode != 200 {
					t.Fatalf("%d %s", resp.StatusCode, out)
				}
				bodies := p.received()
				return bodies[len(bodies)-1]
			}
			first := send(g)
			again := send(filesGW(t, p, true, filesEngine(g.engine.Images, g.engine.Sessions)))
			for _, img := range imgs {
				if n := p.uploadCounts()[digest(img)]; n != 1 {
					t.Errorf("an image uploaded %d times across the restart, want once", n)
				}
			}
			if !bytes.Equal(first, again) {
				t.Fatalf("the restarted gateway sent another body:\n%.300s\n%.300s", first, again)
			}
		})
	}
}

// A wire with no file form for images (Chat Completions) sends base64 as
// ever, file_ids auto or not.
func TestFileIDsLeaveChatCompletionsAlone(t *testing.T) {
	p := newFileProvider(t, upstream.OpenAI)
	g := filesGW(t, p, true)
	_, b64 := samplePNG(t)
	body := []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,` + b64 + `"}}]}]}`)
	g.do(t, "POST", "/v1/chat/completions", "", body, "Authorization", "Bearer sk-one")
	if len(p.uploadCounts()) != 0 {
		t.Fatalf("a chat completions image was uploaded")
	}
	if got := p.received(); len(got) != 1 || !bytes.Equal(got[0], body) {
		t.Fatalf("the body changed")
	}
}

// A Gemini file nears its 48-hour expiry: the next request uploads the
// image again and names the new file, never the one about to go.
func TestFileIDsNeverSendAnExpiringFile(t *testing.T) {
	fw := fileWires()[2]
	p := newFileProvider(t, fw.format)
	g := filesGW(t, p, true)
	img := shots(t, 1)
	send := func() []byte {
		if resp, out := g.do(t, "POST", fw.path, "", fw.body(img, nil), fw.cred...); resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, out)
		}
		bodies := p.received()
		return geminiFileRef.Find(bodies[len(bodies)-1])
	}
	first := send()
	if again := send(); !bytes.Equal(again, first) || p.uploadCounts()[digest(img[0])] != 1 {
		t.Fatalf("a fresh file was uploaded again: %s then %s", first, again)
	}
	g.engine.Now = func() time.Time { return time.Now().Add(47*time.Hour + 30*time.Minute) }
	if later := send(); bytes.Equal(later, first) || p.uploadCounts()[digest(img[0])] != 2 {
		t.Fatalf("a file half an hour from its expiry was sent: %s then %s (uploads %d)", first, later, p.uploadCounts()[digest(img[0])])
	}
}

// A file the provider lost is uploaded again on the sessions path too:
// the turn that names it is refused, sent again with the file uploaded
// anew, and answered.
func TestFileIDsInSessionsUploadALostFileAgain(t *testing.T) {
	p := newFileProvider(t, upstream.Anthropic)
	g := filesGW(t, p, false)
	g.engine.Upstream = &upstream.Client{Format: upstream.Anthropic, BaseURL: p.srv.URL, APIKey: "sk-conf", MaxRetries: -1}
	g.engine.UpstreamFiles = true
	imgs := shots(t, 3)
	id := g.newSession(t, "", `{"model":"claude-sonnet-4-6"}`)
	for i := range 3 {
		if i == 2 {
			p.lose(imgs[0])
		}
		msg := fmt.Sprintf(`{"messages":[{"role":"user","content":[{"type":"text","text":"step %d"},{"type":"image_url","image_url":{"url":"data:image/png;base64,%s"}}]}]}`,
			i, base64.StdEncoding.EncodeToString(imgs[i]))
		if resp, body := g.do(t, "POST", "/v1/sessions/"+id+"/turn", "", []byte(msg)); resp.StatusCode != 200 {
			t.Fatalf("turn %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if ups := p.uploadCounts(); ups[digest(imgs[0])] != 2 || ups[digest(imgs[1])] != 1 || ups[digest(imgs[2])] != 1 {
		t.Fatalf("uploads %v; want the lost image twice, the others once", ups)
	}
	bodies := p.received()
	if len(bodies) != 4 {
		t.Fatalf("%d model requests; want 4 (three turns and the one sent again)", len(bodies))
	}
	if last := bodies[3]; len(anthropicFileRef.FindAll(last, -1)) != 3 || bytes.Contains(last, []byte(`"type":"base64"`)) {
		t.Fatalf("the turn sent again does not name its three images by file: %.300s", last)
	}
}

// The sessions API sends a session's images by file id too (an Anthropic
// upstream with file_ids auto and a configured key): each uploaded once
// across the session's turns. A session that began with file ids off
// keeps the base64 of the images its cache holds; later ones go by file.
func TestFileIDsInSessions(t *testing.T) {
	p := newFileProvider(t, upstream.Anthropic)
	g := filesGW(t, p, false)
	g.engine.Upstream = &upstream.Client{Format: upstream.Anthropic, BaseURL: p.srv.URL, APIKey: "sk-conf", MaxRetries: -1}
	imgs := shots(t, 6)
	id := g.newSession(t, "", `{"model":"claude-sonnet-4-6"}`)
	turn := func(i int) []byte {
		t.Helper()
		msg := fmt.Sprintf(`{"messages":[{"role":"user","content":[{"type":"text","text":"step %d"},{"type":"image_url","image_url":{"url":"data:image/png;base64,%s"}}]}]}`,
			i, base64.StdEncoding.EncodeToString(imgs[i]))
		if resp, body := g.do(t, "POST", "/v1/sessions/"+id+"/turn", "", []byte(msg)); resp.StatusCode != 200 {
			t.Fatalf("turn %d: %d %s", i, resp.StatusCode, body)
		}
		bodies := p.received()
		return bodies[len(bodies)-1]
	}
	for i := range 2 {
		turn(i)
	}
	g.engine.UpstreamFiles = true
	var last []byte
	for i := 2; i < 6; i++ {
		last = turn(i)
	}
	ups := p.uploadCounts()
	for i, img := range imgs {
		if want := map[bool]int{true: 1, false: 0}[i >= 2]; ups[digest(img)] != want {
			t.Errorf("image %d uploaded %d times, want %d", i, ups[digest(img)], want)
		}
	}
	if n := len(anthropicFileRef.FindAll(last, -1)); n != 4 || bytes.Count(last, []byte(`"type":"base64"`)) != 2 {
		t.Fatalf("the last turn names %d files and %d base64 images, want 4 and 2: %.300s", n, bytes.Count(last, []byte(`"type":"base64"`)), last)
	}
	bodies := p.received()
	// Up to the one before's newest message (whose breakpoint moves on).
	prev := bodies[len(bodies)-2]
	prefix := prev[:bytes.LastIndex(prev[:bytes.Index(prev, []byte("step 4"))], []byte(`{"role"`))]
	if bytes.Count(prefix, []byte(`"type":"base64"`)) != 2 || !bytes.HasPrefix(last, prefix) {
		t.Fatalf("the last turn does not start with the one before's bytes")
	}
}
