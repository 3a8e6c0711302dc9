package gateway

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/crc32"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imgctx/imgctx/upstream"
)

func chatBody(imageURL string) []byte {
	b, _ := json.Marshal(map[string]any{"model": "gpt-4o", "messages": []any{map[string]any{"role": "user", "content": []any{
		map[string]any{"type": "text", "text": "look"},
		map[string]any{"type": "image_url", "image_url": map[string]string{"url": imageURL}}}}}})
	return b
}

func pngBomb() string {
	ihdr := make([]byte, 17)
	copy(ihdr, "IHDR")
	binary.BigEndian.PutUint32(ihdr[4:], 100000)
	binary.BigEndian.PutUint32(ihdr[8:], 100000)
	ihdr[12], ihdr[13] = 8, 6
	b := append([]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0d"), ihdr...)
	b = binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(ihdr))
	return base64.StdEncoding.EncodeToString(b)
}

// Every bad input gets a clear error in the provider's shape, the gateway
// keeps serving, and nothing is stored.
func TestBadInputIsRefusedAndNothingStored(t *testing.T) {
	g := newGW(t, upstream.OpenAI, map[string]string{"k-acme": "acme", "k-globex": "globex"})
	// globex stores an image acme must not reach.
	raw, _ := samplePNG(t)
	_, body := g.do(t, "POST", "/v1/images", "k-globex", raw, "Content-Type", "image/png")
	var globex imageInfo
	json.Unmarshal(body, &globex)
	// A local server for redirect tricks.
	redirect := httptest.NewServer(http.RedirectHandler("http://10.0.0.1/x.png", http.StatusFound))
	defer redirect.Close()
	big := bytes.Repeat([]byte("a"), 50<<20)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(append([]byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"`), append(bytes.Repeat([]byte("x"), 9<<20), []byte(`"}]}`)...)...))
	zw.Close()

	cases := []struct {
		name, method, path, key string
		body                    []byte
		header                  []string
		status                  int
		says                    string
	}{
		{"malformed JSON", "POST", "/v1/chat/completions", "k-acme", []byte(`{"model":`), nil, 400, "malformed request"},
		{"JSON, not an object", "POST", "/v1/chat/completions", "k-acme", []byte(`[{"model":"gpt-4o","messages":[]}]`), nil, 400, "not a JSON object"},
		{"a string", "POST", "/v1/messages", "k-acme", []byte(`"hi"`), nil, 400, "not a JSON object"},
		{"a second object after the first", "POST", "/v1/chat/completions", "k-acme", []byte(`{"model":"gpt-4o","messages":[]} {"model":"gpt-4o","messages":[]}`), nil, 400, "trailing data"},
		{"bytes after the object", "POST", "/v1/messages", "k-acme", []byte(`{"model":"claude-sonnet-4-6","messages":[]}x`), nil, 400, "trailing data"},
		{"no messages", "POST", "/v1/chat/completions", "k-acme", []byte(`{"model":"gpt-4o"}`), nil, 400, "no messages"},
		{"50 MB body", "POST", "/v1/chat/completions", "k-acme", big, nil, 413, "8388608 bytes"},
		{"gzip bomb past the limit after decompression", "POST", "/v1/chat/completions", "k-acme", gz.Bytes(), []string{"Content-Encoding", "gzip"}, 413, "8388608 bytes"},
		{"bad base64", "POST", "/v1/chat/completions", "k-acme", chatBody("data:image/png;base64,iVBO*w0K"), nil, 400, "base64"},
		{"unknown format", "POST", "/v1/chat/completions", "k-acme", chatBody("data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte("just some text here"))), nil, 415, "not an image"},
		{"a PDF in an image part", "POST", "/v1/chat/completions", "k-acme", chatBody("data:image/png;base64," + base64.StdEncoding.EncodeToString([]byte("%PDF-1.7\n1 0 obj\n<<>>\nendobj\n%%EOF\n"))), nil, 400, "application/pdf sent as an image"},
		{"100000x100000 PNG header", "POST", "/v1/chat/completions", "k-acme", chatBody("data:image/png;base64," + pngBomb()), nil, 413, "10000000000 pixels"},
		{"another tenant's ref", "POST", "/v1/chat/completions", "k-acme", chatBody("imgctx:" + globex.Ref), nil, 404, "unknown image ref"},
		{"another tenant's image", "GET", "/v1/images/" + globex.Ref, "k-acme", nil, nil, 404, "not found"},
		{"SSRF loopback", "POST", "/v1/chat/completions", "k-acme", chatBody(g.srv.URL + "/healthz"), nil, 422, "not allowed"},
		{"SSRF metadata", "POST", "/v1/chat/completions", "k-acme", chatBody("http://169.254.169.254/latest/meta-data/"), nil, 422, "not allowed"},
		{"SSRF private range", "POST", "/v1/chat/completions", "k-acme", chatBody("http://10.0.0.1/x.png"), nil, 422, "not allowed"},
		{"SSRF redirect to private", "POST", "/v1/chat/completions", "k-acme", chatBody(redirect.URL), nil, 422, "not allowed"},
		{"missing key", "POST", "/v1/chat/completions", "", chatBody("x"), nil, 401, "API key"},
		{"unknown key", "POST", "/v1/messages", "nope", []byte(`{}`), nil, 401, "authentication_error"},
		{"wrong method", "GET", "/v1/chat/completions", "k-acme", nil, nil, 405, "not allowed"},
		{"wrong method on images", "DELETE", "/v1/images", "k-acme", nil, nil, 405, "not allowed"},
		{"bad ref", "GET", "/v1/images/sha256-zz", "k-acme", nil, nil, 400, "bad ref"},
		{"raw image of unknown type", "POST", "/v1/images", "k-acme", []byte("%!PS-Adobe"), []string{"Content-Type", "image/png"}, 415, "unsupported"},
		{"empty image", "POST", "/v1/images", "k-acme", nil, []string{"Content-Type", "image/png"}, 400, "empty"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, body := g.do(t, c.method, c.path, c.key, c.body, c.header...)
			if resp.StatusCode != c.status || !strings.Contains(string(body), c.says) {
				t.Fatalf("%d %s; want %d saying %q", resp.StatusCode, body, c.status, c.says)
			}
			if !json.Valid(body) || !bytes.Contains(body, []byte(`"error"`)) {
				t.Fatalf("not an error in the provider's shape: %s", body)
			}
			if resp, _ := g.do(t, "GET", "/healthz", "", nil); resp.StatusCode != 200 {
				t.Fatal("the gateway stopped serving")
			}
		})
	}
	if n := g.stored(t, "acme"); n != 0 {
		t.Fatalf("refused input left %d images for acme", n)
	}
	if len(g.up.received()) != 0 {
		t.Fatal("a refused request reached the upstream")
	}
	// The Anthropic route answers in Anthropic's shape.
	ga := newGW(t, upstream.Anthropic, nil)
	_, b := ga.do(t, "POST", "/v1/messages", "", []byte(`{"messages":[`))
	if !bytes.HasPrefix(b, []byte(`{"error":{"message"`)) && !bytes.HasPrefix(b, []byte(`{"error":{"type"`)) && !bytes.Contains(b, []byte(`"type":"error"`)) {
		t.Fatalf("anthropic-shaped error expected: %s", b)
	}
}

// 200 requests at once: each is answered (200, or 429 past the bound),
// none hangs, and the gateway keeps serving.
func TestTwoHundredConcurrentRequests(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	g.up.eventGap = 0
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	body := []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	for range 200 {
		wg.Go(func() {
			resp, err := http.Post(g.srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			codes[resp.StatusCode]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[200]+codes[429] != 200 || codes[200] == 0 {
		t.Fatalf("status counts %v", codes)
	}
	if resp, _ := g.do(t, "GET", "/healthz", "", nil); resp.StatusCode != 200 {
		t.Fatal("the gateway stopped serving")
	}
}

// A client that goes away mid-stream cancels the upstream request and
// leaves the gateway serving.
func TestClientDisconnectMidStream(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	g.up.eventGap = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, "POST", g.srv.URL+"/v1/chat/completions",
		strings.NewReader(`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	select {
	case <-g.up.cancelled:
	case <-time.After(3 * time.Second):
		t.Fatal("the upstream request went on after the client left")
	}
	if resp, _ := g.do(t, "GET", "/healthz", "", nil); resp.StatusCode != 200 {
		t.Fatal("the gateway stopped serving")
	}

}
