package upstream

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imgctx/imgctx/wire"
)

// earlyUpstream records the bodies that came whole and counts those that
// did not, and reports how far each request's body has come.
type earlyUpstream struct {
	srv      *httptest.Server
	mu       sync.Mutex
	whole    [][]byte
	partial  int
	progress chan int // bytes of the current body read so far
}

func newEarlyUpstream(t *testing.T) *earlyUpstream {
	u := &earlyUpstream{progress: make(chan int, 1024)}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b bytes.Buffer
		p := make([]byte, 32<<10)
		signal := func() {
			select {
			case u.progress <- b.Len():
			default:
			}
		}
		for {
			n, err := r.Body.Read(p)
			b.Write(p[:n])
			if err == io.EOF {
				u.mu.Lock()
				u.whole = append(u.whole, b.Bytes())
				u.mu.Unlock()
				signal()
				break
			}
			if err != nil {
				u.mu.Lock()
				u.partial++
				u.mu.Unlock()
				signal() // after the count, for whoever waits on it
				return
			}
			signal()
		}
		io.WriteString(w, `{}`)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

// waitFor blocks until the body in flight has reached n bytes.
func (u *earlyUpstream) waitFor(t *testing.T, n int) {
	t.Helper()
	for got := range u.progress {
		if got >= n {
			return
		}
	}
}

func (u *earlyUpstream) counts() ([][]byte, int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.whole, u.partial
}

func earlyBody() []byte {
	return []byte(`{"model":"m","messages":[` + strings.Repeat(`{"role":"user","content":"hello"},`, 20_000) + `{"role":"user","content":"end"}]}`)
}

// A request started early goes as far as the bytes read so far, never to
// its last byte before it is decided; sent as it arrived, it finishes and
// the upstream reads it once, whole.
func TestEarlyFinishesWhenTheBodyGoesAsItCame(t *testing.T) {
	u := newEarlyUpstream(t)
	c := &Client{Format: OpenAI, BaseURL: u.srv.URL, HTTP: &http.Client{Transport: NewTransport()}, MaxRetries: -1}
	body := earlyBody()
	buf := make([]byte, len(body))
	var closed atomic.Int32
	closedOnce := make(chan struct{})
	r := Request{Path: "/v1/chat/completions", Header: http.Header{"X-Agent": {"a"}}}
	e := c.Start(t.Context(), r, buf, nil, func() {
		if closed.Add(1) == 1 {
			close(closedOnce)
		}
	})
	half := len(buf) / 2
	copy(buf, body[:half])
	e.Advance(half)
	u.waitFor(t, half) // the first half is upstream before the rest is read
	copy(buf[half:], body[half:])
	e.Advance(len(buf))
	u.waitFor(t, len(buf)-1)
	if whole, _ := u.counts(); len(whole) != 0 {
		t.Fatal("the upstream read a whole request before it was decided")
	}
	r.Body, r.Early = wire.BodyOf(buf), e
	resp, err := c.Send(t.Context(), r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	whole, partial := u.counts()
	if len(whole) != 1 || partial != 0 || !bytes.Equal(whole[0], body) {
		t.Fatalf("%d whole (%d partial), want the body once", len(whole), partial)
	}
	select { // the transport closes a request's body once it is done with it, maybe after the answer
	case <-closedOnce:
	case <-time.After(10 * time.Second):
		t.Fatal("the transport never closed the body")
	}
	e.Abandon()
	if n := closed.Load(); n != 1 {
		t.Fatalf("the body was closed %d times", n)
	}
}

// When the decided body is not the client's bytes as they are — an edit,
// other headers — or nothing is sent at all, the early request is
// abandoned short of its end and the upstream reads only the decided one.
func TestEarlyIsAbandonedForAnotherBody(t *testing.T) {
	body := earlyBody()
	edited := bytes.Replace(body, []byte(`"end"`), []byte(`"END"`), 1)
	for name, decide := range map[string]func(c *Client, r Request, e *Early) (*http.Response, error){
		"edited": func(c *Client, r Request, e *Early) (*http.Response, error) {
			r.Body, r.Early = wire.BodyOf(edited), e
			return c.Send(t.Context(), r)
		},
		"same bytes, another buffer": func(c *Client, r Request, e *Early) (*http.Response, error) {
			r.Body, r.Early = wire.BodyOf(bytes.Clone(body)), e
			return c.Send(t.Context(), r)
		},
		"other headers": func(c *Client, r Request, e *Early) (*http.Response, error) {
			r.Body, r.Early, r.Header = wire.BodyOf(e.buf), e, http.Header{"X-Agent": {"b"}}
			return c.Send(t.Context(), r)
		},
		"refused": func(c *Client, r Request, e *Early) (*http.Response, error) {
			e.Abandon()
			return nil, nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			u := newEarlyUpstream(t)
			c := &Client{Format: OpenAI, BaseURL: u.srv.URL, HTTP: &http.Client{Transport: NewTransport()}, MaxRetries: -1}
			buf := bytes.Clone(body)
			r := Request{Path: "/v1/chat/completions", Header: http.Header{"X-Agent": {"a"}}}
			e := c.Start(t.Context(), r, buf, nil, nil)
			e.Advance(len(buf))
			u.waitFor(t, len(buf)-1)
			resp, err := decide(c, r, e)
			if err != nil {
				t.Fatal(err)
			}
			if resp != nil {
				resp.Body.Close()
			}
			e.Abandon() // as the gateway does after every request: a no-op now
			for {
				if _, partial := u.counts(); partial == 1 {
					break
				}
				<-u.progress // the abandoned request's handler is still reading
			}
			whole, _ := u.counts()
			switch {
			case name == "refused" && len(whole) != 0:
				t.Fatalf("a refused request reached the upstream whole")
			case name != "refused" && len(whole) != 1:
				t.Fatalf("%d whole requests, want the decided one", len(whole))
			case name == "edited" && !bytes.Equal(whole[0], edited):
				t.Fatal("the upstream got another body than the decided one")
			}
		})
	}
}

// markerEdits replace the first two "hello"s with markers, one near the
// start and one past the middle, and add a field at the end.
func markerEdits(body []byte) []wire.Edit {
	at := func(from int) int { return from + bytes.Index(body[from:], []byte(`"hello"`)) }
	marker := func(w *wire.BodyWriter) { w.WriteString(`"[image removed]"`) }
	first, second := at(0), at(len(body)*3/5)
	return []wire.Edit{
		{Start: first, End: first + len(`"hello"`), Write: marker},
		{Start: second, End: second + len(`"hello"`), Write: marker},
		{Start: len(body) - 1, End: len(body) - 1, Write: func(w *wire.BodyWriter) { w.WriteString(`,"n":1`) }},
	}
}

// A request started with changes — the ones made to the conversation's
// previous request, made again — sends the client's bytes with them as
// they arrive, what a change replaces once all of it has arrived; decided
// with exactly those changes it finishes, and the upstream reads that
// body once, whole. Decided with others it is abandoned.
func TestEarlyGoesWithTheChangesMadeAgain(t *testing.T) {
	body := earlyBody()
	for _, same := range []bool{true, false} {
		u := newEarlyUpstream(t)
		c := &Client{Format: OpenAI, BaseURL: u.srv.URL, HTTP: &http.Client{Transport: NewTransport()}, MaxRetries: -1}
		buf := make([]byte, len(body))
		before, err := wire.Splice(body, markerEdits(body)) // the previous request's, on its own buffer
		if err != nil {
			t.Fatal(err)
		}
		changes, ok := before.Changes(body, 1<<10)
		if !ok || len(changes) != 3 {
			t.Fatalf("changes %v, %v", changes, ok)
		}
		r := Request{Path: "/v1/chat/completions"}
		e := c.Start(t.Context(), r, buf, changes, nil)
		half := len(buf) / 2
		copy(buf, body[:half])
		e.Advance(half)
		u.waitFor(t, half) // the first half, a marker in it, is upstream before the rest is read
		copy(buf[half:], body[half:])
		e.Advance(len(buf))
		want := before.Bytes()
		u.waitFor(t, len(want)-1)
		if whole, _ := u.counts(); len(whole) != 0 {
			t.Fatal("the upstream read a whole request before it was decided")
		}
		edits := markerEdits(buf)
		if !same {
			edits = edits[:2] // no field added at the end
		}
		decided, err := wire.Splice(buf, edits)
		if err != nil {
			t.Fatal(err)
		}
		r.Body, r.Early = decided, e
		resp, err := c.Send(t.Context(), r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if same {
			whole, partial := u.counts()
			if len(whole) != 1 || partial != 0 || !bytes.Equal(whole[0], want) {
				t.Fatalf("%d whole (%d partial), want the changed body once", len(whole), partial)
			}
			continue
		}
		for {
			if _, partial := u.counts(); partial == 1 {
				break
			}
			<-u.progress // the abandoned request's handler is still reading
		}
		if whole, _ := u.counts(); len(whole) != 1 || !bytes.Equal(whole[0], decided.Bytes()) {
			t.Fatalf("%d whole requests, want the decided one alone", len(whole))
		}
	}
}
