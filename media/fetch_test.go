package media

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/imgctx/imgctx/reason"
	"golang.org/x/net/dns/dnsmessage"
)

// fakeDNS answers every A query with addr, on a loopback UDP port. It lets a
// test make a public-looking name resolve to a private address through the
// real resolver and dialer path.
func fakeDNS(t *testing.T, addr [4]byte) *net.Resolver {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true})
			b.StartQuestions()
			b.Question(q)
			b.StartAnswers()
			if q.Type == dnsmessage.TypeA {
				b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: addr})
			}
			msg, _ := b.Finish()
			pc.WriteTo(msg, from)
		}
	}()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", pc.LocalAddr().String())
	}}
}

func imageServer(t *testing.T) *httptest.Server {
	img := pngOf(t, 8, 8)
	mux := http.NewServeMux()
	mux.HandleFunc("/img.png", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "image/png")
		w.Write(img)
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
	})
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/loop", http.StatusFound)
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		w.Write(make([]byte, 5000))
	})
	mux.HandleFunc("/big-declared", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1073741824") // refused on its word, before a byte is read
		w.WriteHeader(http.StatusOK)
	})
	slow := make(chan struct{})
	t.Cleanup(func() { close(slow) })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select { // answers only once the client gave up
		case <-r.Context().Done():
		case <-slow:
		}
	})
	mux.HandleFunc("/big-chunked", func(w http.ResponseWriter, r *http.Request) {
		for range 10 {
			w.Write(make([]byte, 1000))
			w.(http.Flusher).Flush()
		}
	})
	mux.HandleFunc("/missing", http.NotFound)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func TestFetchAllowedLoopbackForTests(t *testing.T) {
	srv := imageServer(t)
	f := &Fetcher{AllowLoopback: true, AnyPort: true}
	got, err := f.Fetch(context.Background(), srv.URL+"/img.png")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Inspect(got.Data, got.ContentType, Limits{}); err != nil || got.ContentType != "image/png" {
		t.Fatalf("fetched %q: %v", got.ContentType, err)
	}
	// Up to three redirects are followed.
	got, err = f.Fetch(context.Background(), srv.URL+"/redirect?to=/redirect%3Fto%3D/img.png")
	if err != nil || !strings.HasSuffix(got.FinalURL, "/img.png") {
		t.Fatalf("redirect chain: %v %q", err, got.FinalURL)
	}
}

func TestFetchRefusals(t *testing.T) {
	srv := imageServer(t)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close() // nothing listens there any more
	strict := &Fetcher{AnyPort: true, Timeout: 2 * time.Second}
	open := &Fetcher{AllowLoopback: true, AnyPort: true, MaxBytes: 4096, Timeout: 2 * time.Second}
	named := &Fetcher{AnyPort: true, Resolver: fakeDNS(t, [4]byte{10, 0, 0, 1}), Timeout: 2 * time.Second}
	cases := []struct {
		name string
		f    *Fetcher
		url  string
		want reason.Code
		msg  string
	}{
		{"loopback v4", strict, srv.URL + "/img.png", reason.FetchFailed, "not allowed"},
		{"loopback v6", strict, fmt.Sprintf("http://[::1]:%d/img.png", port), reason.FetchFailed, "not allowed"},
		{"loopback by name", strict, fmt.Sprintf("http://localhost:%d/img.png", port), reason.FetchFailed, "not allowed"},
		{"metadata link-local", strict, "http://169.254.169.254/latest/meta-data/", reason.FetchFailed, "not allowed"},
		{"private 10/8", strict, "http://10.0.0.1/x.png", reason.FetchFailed, "not allowed"},
		{"private 192.168/16", strict, "http://192.168.1.1/x.png", reason.FetchFailed, "not allowed"},
		{"ipv4-mapped ipv6", strict, "http://[::ffff:127.0.0.1]/x.png", reason.FetchFailed, "not allowed"},
		{"decimal ip trick", strict, "http://2130706433/x.png", reason.FetchFailed, "numeric host"},
		{"hex ip trick", open, "http://0x7f.1/x.png", reason.FetchFailed, "numeric host"},
		{"octal ip trick", open, "http://0177.0.0.1/x.png", reason.FetchFailed, "numeric host"},
		{"hex dotted ip trick", open, "http://0x7F.0x0.0x0.0x1/x.png", reason.FetchFailed, "numeric host"},
		{"name resolving to a private address", named, "http://images.example.com/x.png", reason.FetchFailed, "not allowed"},
		{"redirect to a private address", open, srv.URL + "/redirect?to=http://10.0.0.1/x.png", reason.FetchFailed, "not allowed"},
		{"redirect to metadata", open, srv.URL + "/redirect?to=http://169.254.169.254/", reason.FetchFailed, "not allowed"},
		{"redirect to a file URL", open, srv.URL + "/redirect?to=file:///etc/passwd", reason.FetchFailed, "scheme"},
		{"too many redirects", open, srv.URL + "/loop", reason.FetchFailed, "redirects"},
		{"body over the cap", open, srv.URL + "/big", reason.TooLarge, "4096"},
		{"chunked body over the cap", open, srv.URL + "/big-chunked", reason.TooLarge, "4096"},
		{"declared body over the cap", open, srv.URL + "/big-declared", reason.TooLarge, "1073741824"},
		{"no answer in time", &Fetcher{AllowLoopback: true, AnyPort: true, Timeout: 200 * time.Millisecond}, srv.URL + "/slow", reason.FetchFailed, "no answer within 200ms"},
		{"no host", open, "http:///x.png", reason.FetchFailed, "no host"},
		{"not found", open, srv.URL + "/missing", reason.FetchFailed, "404"},
		{"connection refused", open, closed.URL + "/x.png", reason.FetchFailed, "could not fetch " + closed.URL + "/x.png"},
		{"ftp scheme", open, "ftp://example.com/x.png", reason.FetchFailed, "scheme"},
		{"credentials", open, "http://user:pw@127.0.0.1/x.png", reason.FetchFailed, "credentials"},
		{"unparsable", open, "http://[::1", reason.FetchFailed, ""},
		{"default port policy", &Fetcher{AllowLoopback: true}, srv.URL + "/img.png", reason.FetchFailed, "not allowed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := c.f.Fetch(context.Background(), c.url)
			wantReason(t, err, c.want)
			if !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("error %q does not say %q", err, c.msg)
			}
			// Regression (issue "Hardening", item 8): the transport's text
			// ("dial tcp 10.0.0.1:80: prohibited IP address", the resolver's
			// address) reached the client.
			for _, leak := range []string{"dial tcp", "10.0.0.1:80", "lookup ", "prohibited IP"} {
				if strings.Contains(err.Error(), leak) {
					t.Fatalf("error %q discloses %q", err, leak)
				}
			}
		})
	}
}

// Only inet_aton's numeric forms are numeric hosts: names that hold
// digits, and the standard address forms, are not.
func TestNumericHost(t *testing.T) {
	for host, want := range map[string]bool{
		"2130706433": true, "0x7f.1": true, "0177.0.0.1": true, "127.1": true, "0x7F.0x0.0x0.0x1": true, "127.0.0.1.": true,
		"127.0.0.1": false, "[::1]": false, "images.example.com": false, "1e100.net": false, "0x7f.example": false,
		"1.2.3.4.5": false, "0x": false, "": false,
	} {
		if got := numericHost(host); got != want {
			t.Errorf("numericHost(%q) = %v; want %v", host, got, want)
		}
	}
}
