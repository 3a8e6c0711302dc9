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
