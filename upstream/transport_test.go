package upstream

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imgctx/imgctx/wire"
)

// A body of pieces — the client's runs and large strings such as cached
// base64 — reaches the upstream byte for byte through NewTransport, on the
// first attempt and on a retry, which reads the body anew.
func TestTransportSendsPiecedBodiesWhole(t *testing.T) {
	var w wire.BodyWriter
	w.WriteString(`{"messages":[`)
	client := bytes.Repeat([]byte(`{"role":"user","content":"run"},`), 20_000)
	w.Slice(client)
	w.Big(`"` + strings.Repeat("QUJD", 300_000) + `"`)
	w.WriteString(`]}`)
	body := w.Body()
	want := body.Bytes()

	var mu sync.Mutex
	var got [][]byte
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, b)
		first := len(got) == 1
		mu.Unlock()
		if first {
			rw.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(rw, `{}`)
	}))
	t.Cleanup(srv.Close)
	c := &Client{Format: OpenAI, BaseURL: srv.URL, HTTP: &http.Client{Transport: NewTransport()},
		Sleep: func(context.Context, time.Duration) error { return nil }}
	resp, err := c.DoBody(t.Context(), body, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(got) != 2 {
		t.Fatalf("%d attempts, want 2", len(got))
	}
	for i, b := range got {
		if !bytes.Equal(b, want) {
			t.Fatalf("attempt %d: %d bytes, want the body's %d", i+1, len(b), len(want))
		}
	}
}

// onlyRest is a body that must be handed over whole: reading it fails the
// test.
type onlyRest struct {
	t    *testing.T
	bufs [][]byte
	max  int64
}

func (r *onlyRest) Read([]byte) (int, error) {
	r.t.Error("the body was read through a copy buffer")
	return 0, io.EOF
}

func (r *onlyRest) Rest(max int64) ([][]byte, bool) {
	r.max = max
	return r.bufs, true
}

// refuses is a body whose Rest declines: it is read as any reader.
type refuses struct{ io.Reader }

func (refuses) Rest(int64) ([][]byte, bool) { return nil, false }

// The connection writes a body's rest as it is when the body hands it
// over, and reads the others as any connection does.
func TestVectorConnWritesTheRestAsItIs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	received := make(chan []byte, 2)
	go func() {
		for range 2 {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b, _ := io.ReadAll(c)
			received <- b
			c.Close()
		}
	}()
	send := func(body io.Reader, n int64) []byte {
		c, err := (&net.Dialer{}).DialContext(t.Context(), "tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		vc := &vectorConn{c.(*net.TCPConn)}
		if m, err := io.Copy(vc, &io.LimitedReader{R: body, N: n}); err != nil || m != n {
			t.Fatalf("copied %d of %d bytes: %v", m, n, err)
		}
		vc.Close()
		return <-received
	}

	bufs := [][]byte{bytes.Repeat([]byte("a"), 100_000), []byte("b"), bytes.Repeat([]byte("c"), 3<<20)}
	whole := bytes.Join(bufs, nil)
	r := &onlyRest{t: t, bufs: bufs}
	if got := send(r, int64(len(whole))); !bytes.Equal(got, whole) {
		t.Fatalf("handed over: received %d bytes, want %d", len(got), len(whole))
	}
	if r.max != int64(len(whole)) {
		t.Fatalf("Rest asked for at most %d bytes, want the declared %d", r.max, len(whole))
	}
	if got := send(refuses{bytes.NewReader(whole)}, int64(len(whole))); !bytes.Equal(got, whole) {
		t.Fatalf("read: received %d bytes, want %d", len(got), len(whole))
	}
}

// writeCounter counts the writes made on a connection.
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCounter) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// A small body leaves with its request's headers in one write, however
// it is held (pieces, a tracked buffer): net/http flushes the headers
// first for any body but an in-memory reader it knows, and the upstream
// then reads, and wakes for, the request twice. A body past smallBody
// goes from its pieces, after the headers.
func TestASmallBodyLeavesWithItsHeadersInOneWrite(t *testing.T) {
	var got []byte
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		got, _ = io.ReadAll(r.Body)
		io.WriteString(rw, `{}`)
	}))
	t.Cleanup(srv.Close)
	var writes atomic.Int64
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		return writeCounter{c, &writes}, err
	}
	c := &Client{Format: OpenAI, BaseURL: srv.URL, HTTP: &http.Client{Transport: tr}, MaxRetries: -1}
	send := func(n int) int64 {
		var w wire.BodyWriter
		w.WriteString(`{"messages":[{"role":"user","content":"`)
		buf := bytes.Repeat([]byte("word "), n/5)
		w.Slice(buf) // a piece of the client's buffer
		w.WriteString(`"}]}`)
		var open sync.WaitGroup
		body := w.Body().Tracked(&open)
		writes.Store(0)
		resp, err := c.DoBody(t.Context(), body, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		open.Wait() // every reader of the tracked buffer done
		if !bytes.Equal(got, body.Bytes()) {
			t.Fatalf("%d-byte body: the upstream read %d bytes, not the body", body.Len(), len(got))
		}
		return writes.Load()
	}
	if n := send(1000); n != 1 {
		t.Errorf("a 1 KB body went in %d writes, want 1 with its headers", n)
	}
	if n := send(3 * smallBody); n < 2 {
		t.Errorf("a %d-byte body went in %d writes: past smallBody its headers go first", 3*smallBody, n)
	}
}
