package gateway

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/internal/bodies"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/prometheus/client_golang/prometheus"
)

// progressUpstream answers OpenAI chat requests, records the bodies that
// came whole, and reports how far the body in flight has come.
type progressUpstream struct {
	mu       sync.Mutex
	whole    [][]byte
	partial  int // requests abandoned before their end
	progress chan int
}

func (u *progressUpstream) handle(w http.ResponseWriter, r *http.Request) {
	var b bytes.Buffer
	p := make([]byte, 64<<10)
	for {
		n, err := r.Body.Read(p)
		b.Write(p[:n])
		select {
		case u.progress <- b.Len():
		default:
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			u.mu.Lock()
			u.partial++ // abandoned: not a request
			u.mu.Unlock()
			return
		}
	}
	u.mu.Lock()
	u.whole = append(u.whole, b.Bytes())
	u.mu.Unlock()
	if bytes.Contains(b.Bytes(), []byte(`"stream":true`)) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}]}\n\n"+
			"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, completion)
}

func (u *progressUpstream) received() [][]byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([][]byte(nil), u.whole...)
}

func earlyGateway(t *testing.T) (*progressUpstream, string) {
	return earlyGatewayWith(t, engine.Config{})
}

func earlyGatewayWith(t *testing.T, cfg engine.Config) (*progressUpstream, string) {
	u := &progressUpstream{progress: make(chan int, 4096)}
	up := httptest.NewServer(http.HandlerFunc(u.handle))
	t.Cleanup(up.Close)
	e := &engine.Engine{Images: imagestore.Verified{Store: &imagestore.Mem{}}, Sessions: &session.Mem{}, Profiles: tokens.Default(), Config: cfg,
		Upstream: &upstream.Client{Format: upstream.OpenAI, BaseURL: up.URL, MaxRetries: -1, HTTP: &http.Client{Transport: upstream.NewTransport()}}}
	s := New(Config{MaxBodyBytes: 64 << 20, MaxConcurrent: 64}, e, prometheus.NewRegistry(), discardLogger())
	gw := httptest.NewServer(s.Handler())
	t.Cleanup(gw.Close)
	t.Cleanup(s.Close)
	return u, gw.URL + chatPath
}

// codingHistory is a text-only agent history of the given rounds, over
// arrivingFrom, with tail written after its messages.
func codingHistory(rounds int, tail string) []byte {
	msgs := []string{`{"role":"system","content":"you write code` + strings.Repeat(" carefully", 800) + `"}`}
	for k := range rounds {
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":"step %03d %s"}`, k, strings.Repeat("y", 900)),
			fmt.Sprintf(`{"role":"assistant","content":"done %03d"}`, k))
	}
	return []byte(`{"model":"gpt-4o","messages":[` + strings.Join(msgs, ",") + `]` + tail + `}`)
}

// post sends body, its first part at once and the rest once release is
// closed (nil: all at once), and returns the status.
func post(t *testing.T, url string, body []byte, first int, release chan struct{}) int {
	t.Helper()
	var rd io.Reader = bytes.NewReader(body)
	if release != nil {
		rd = io.MultiReader(bytes.NewReader(body[:first]), readerFunc(func(p []byte) (int, error) {
			<-release
			return 0, io.EOF
		}), bytes.NewReader(body[first:]))
	}
	req, _ := http.NewRequestWithContext(t.Context(), "POST", url, rd)
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// Once a conversation's request went upstream as its client sent it, the
// next one goes up while it arrives: the history it shares with the one
// before reaches the upstream before the client has sent the rest — and the
// upstream reads each request once, whole, as the client sent it.
func TestEarlySendsTheHistoryWhileItArrives(t *testing.T) {
	u, url := earlyGateway(t)
	first, second := codingHistory(60, ""), codingHistory(61, "")
	if st := post(t, url, first, 0, nil); st != 200 {
		t.Fatalf("first request: %d", st)
	}
	u.sentEarly(t, url, second, len(first)/2)
	got := u.received()
	if len(got) != 2 || !bytes.Equal(got[0], first) || !bytes.Equal(got[1], second) {
		t.Fatalf("the upstream read %d whole requests, want the two as sent", len(got))
	}
}

// sentEarly posts body, all but its last tenth held back until n bytes of
// it reached the upstream — so it went up while it arrived — and checks
// it was answered, none abandoned: the one sent early was the one decided.
func (u *progressUpstream) sentEarly(t *testing.T, url string, body []byte, n int) {
	t.Helper()
	for len(u.progress) > 0 {
		<-u.progress
	}
	release := make(chan struct{})
	done := make(chan int)
	go func() { done <- post(t, url, body, len(body)*9/10, release) }()
	deadline := time.After(10 * time.Second)
wait:
	for {
		select {
		case got := <-u.progress:
			if got >= n {
				break wait
			}
		case <-deadline:
			close(release)
			t.Fatal("nothing of the request reached the upstream before its client sent the rest")
		}
	}
	close(release)
	if st := <-done; st != 200 {
		t.Fatalf("request sent early: %d", st)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.partial != 0 {
		t.Fatalf("%d requests abandoned: the one sent early was not the one decided", u.partial)
	}
}

// When imgctx changed a conversation's request — markers where it removed
// images, usage asked of a stream — the next one goes up while it arrives
// with the same changes made again, and the upstream reads it once, whole,
// as decided.
func TestEarlySendsTheChangesOfTheRequestBefore(t *testing.T) {
	t.Run("markers", func(t *testing.T) {
		// A budget that holds no screenshot: each is a marker in every request.
		u, url := earlyGatewayWith(t, engine.Config{Keep: policy.KeepConfig{BudgetFraction: 0.002}})
		var urls []string
		for i := range 3 {
			urls = append(urls, "data:image/png;base64,"+base64.StdEncoding.EncodeToString(bodies.Screenshot(uint64(i))))
		}
		// Text enough that the markers leave more than a quarter of the body
		// (engine.Arriving.Sent).
		first, second := bodies.AgentRounds(urls, 100), bodies.AgentRounds(urls, 101)
		if st := post(t, url, first, 0, nil); st != 200 {
			t.Fatalf("first request: %d", st)
		}
		sent := u.received()[0]
		// The first two markers go up before the client sends its last tenth.
		mark := []byte("[image removed")
		twoMarkers := bytes.Index(sent, mark) + len(mark)
		twoMarkers += bytes.Index(sent[twoMarkers:], mark) + len(mark)
		u.sentEarly(t, url, second, twoMarkers)
		got := u.received()
		if len(got) != 2 {
			t.Fatalf("the upstream read %d whole requests, want 2", len(got))
		}
		for i, b := range got {
			if n := bytes.Count(b, []byte("[image removed")); n != 3 || bytes.Contains(b, []byte("base64,")) {
				t.Fatalf("request %d went up with %d markers, want its 3 screenshots removed", i+1, n)
			}
		}
		if !bytes.HasPrefix(got[1], sent[:twoMarkers]) {
			t.Fatal("the second request does not repeat the first as it went up")
		}
	})
	t.Run("usage asked of a stream", func(t *testing.T) {
		u, url := earlyGateway(t)
		first, second := codingHistory(60, `,"stream":true`), codingHistory(61, `,"stream":true`)
		if st := post(t, url, first, 0, nil); st != 200 {
			t.Fatalf("first request: %d", st)
		}
		u.sentEarly(t, url, second, len(first)/2)
		got := u.received()
		ask := `,"stream_options":{"include_usage":true}}`
		if len(got) != 2 || !bytes.Equal(got[1], append(second[:len(second)-1:len(second)-1], ask...)) {
			t.Fatalf("the upstream read %d whole requests, want the second as sent with usage asked", len(got))
		}
	})
}

// A request started early and then decided otherwise — an edit (usage
// asked of a stream), or a refusal — never reaches the upstream whole: the
// upstream reads the decided body alone, or nothing.
func TestEarlyRequestsDecidedOtherwiseNeverReachTheUpstreamWhole(t *testing.T) {
	u, url := earlyGateway(t)
	first := codingHistory(60, "")
	if st := post(t, url, first, 0, nil); st != 200 {
		t.Fatalf("first request: %d", st)
	}
	streamed := codingHistory(61, `,"stream":true`)
	if st := post(t, url, streamed, 0, nil); st != 200 {
		t.Fatalf("streamed request: %d", st)
	}
	got := u.received()
	if len(got) != 2 || !bytes.Contains(got[1], []byte(`"stream_options":{"include_usage":true}`)) {
		t.Fatalf("the upstream read %d whole requests, want the first and the streamed one with usage asked", len(got))
	}
	if !bytes.Equal(got[1], append(streamed[:len(streamed)-1:len(streamed)-1], `,"stream_options":{"include_usage":true}}`...)) {
		t.Fatalf("the streamed request went up as %.80s…", got[1][len(got[1])-80:])
	}
	// Back to a request sent as it came, then one whose end is malformed.
	if st := post(t, url, codingHistory(62, ""), 0, nil); st != 200 {
		t.Fatalf("third request: %d", st)
	}
	broken := codingHistory(63, "")
	broken = append(broken[:len(broken)-2:len(broken)-2], `}}`...) // the messages array never closes
	if st := post(t, url, broken, 0, nil); st != http.StatusBadRequest {
		t.Fatalf("a malformed request: %d, want 400", st)
	}
	if got := u.received(); len(got) != 3 {
		t.Fatalf("the upstream read %d whole requests, want 3: a refused one reached it", len(got))
	}
}

// A client that goes away mid-body, its request already started upstream,
// leaves the upstream nothing whole, and the gateway serves the next one.
func TestEarlyClientGoneMidBody(t *testing.T) {
	u, url := earlyGateway(t)
	first := codingHistory(60, "")
	if st := post(t, url, first, 0, nil); st != 200 {
		t.Fatalf("first request: %d", st)
	}
	for len(u.progress) > 0 {
		<-u.progress
	}
	second := codingHistory(61, "")
	gone := make(chan struct{})
	req, _ := http.NewRequest("POST", url, io.MultiReader(bytes.NewReader(second[:len(second)/2]), readerFunc(func([]byte) (int, error) {
		<-gone
		return 0, errors.New("client gone")
	})))
	req.ContentLength = int64(len(second))
	done := make(chan error)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	deadline := time.After(10 * time.Second)
	for n := 0; n < len(first)/4; {
		select {
		case n = <-u.progress:
		case <-deadline:
			close(gone)
			t.Fatal("nothing of the second request reached the upstream")
		}
	}
	close(gone)
	if err := <-done; err == nil {
		t.Fatal("a body cut short was answered")
	}
	third := codingHistory(62, "")
	if st := post(t, url, third, 0, nil); st != 200 {
		t.Fatalf("the request after: %d", st)
	}
	got := u.received()
	if len(got) != 2 || !bytes.Equal(got[1], third) {
		t.Fatalf("the upstream read %d whole requests, want the first and the third", len(got))
	}
}
