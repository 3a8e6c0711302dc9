package main

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/imgctx/imgctx/internal/testsvc"
)

// docs/deploy.md's HAProxy configuration, read from the file, in front of
// four `imgctx serve` replicas: requests spread over them; a replica that
// drains on SIGTERM loses no request; a replica killed while it serves one
// answers that one with the configured 502 in the providers' error shape,
// and the next requests go to the others.
func TestHAProxyInFrontOfReplicas(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs four imgctx processes and haproxy")
	}
	haproxy := testsvc.HAProxy(t)
	up := newHoldingUpstream()
	defer up.Close()
	bin := buildImgctx(t)
	names := []string{"a", "b", "c", "d"}
	replicas := map[string]*replica{}
	var servers []string
	for _, n := range names {
		// Each replica reaches the upstream under its own path, so the
		// upstream knows which one forwarded a request.
		r := startReplica(t, bin, []string{"IMGCTX_SERVER_ADDR=127.0.0.1:0", "IMGCTX_LOG_LEVEL=warn",
			"IMGCTX_UPSTREAM_BASE_URL=" + up.URL + "/" + n, "IMGCTX_UPSTREAM_FORMAT=anthropic"})
		replicas[n] = r
		servers = append(servers, fmt.Sprintf("    server imgctx-%s %s check", n, strings.TrimPrefix(r.url, "http://")))
	}
	lb := startHAProxy(t, haproxy, servers)

	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	askWith := func(c *http.Client, text string) (int, []byte) {
		body := fmt.Sprintf(`{"model":"claude-sonnet-4-6","max_tokens":16,"messages":[{"role":"user","content":%q}]}`, text)
		resp, err := c.Post(lb+"/v1/messages", "application/json", strings.NewReader(body))
		if err != nil {
			return 0, []byte(err.Error())
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	ask := func(text string) (int, []byte) { return askWith(http.DefaultClient, text) }

	t.Run("requests spread over the replicas", func(t *testing.T) {
		for i := range 30 {
			if code, b := ask(fmt.Sprintf("hello %d", i)); code != 200 {
				t.Fatalf("request %d: %d %s", i, code, b)
			}
		}
		for _, n := range names {
			if up.served(n) == 0 {
				t.Errorf("replica %s served none of 30 requests (%v)", n, up.counts())
			}
		}
	})

	t.Run("a replica draining on SIGTERM loses no request", func(t *testing.T) {
		var failed []string
		stop := time.Now().Add(9 * time.Second)
		time.AfterFunc(time.Second, func() { replicas["a"].proc.Signal(syscall.SIGTERM) })
		for i := 0; time.Now().Before(stop); i++ {
			if code, b := ask(fmt.Sprintf("during the drain %d", i)); code != 200 {
				failed = append(failed, fmt.Sprintf("%d %s", code, b))
			}
			time.Sleep(20 * time.Millisecond)
		}
		if len(failed) > 0 {
			t.Fatalf("%d requests failed while a replica drained: %v", len(failed), failed)
		}
		if err := replicas["a"].wait(10 * time.Second); err != nil {
			t.Fatalf("the drained replica did not exit 0: %v", err)
		}
	})

	// A replica killed while it serves a request: on a connection of its
	// own the client gets the configured 502; on one it kept alive from
	// earlier requests HAProxy closes it with no answer (its rule for a
	// keep-alive race, which clients retry). The next requests go to the
	// replicas left.
	killed := map[string]bool{}
	for _, c := range []struct {
		name   string
		client *http.Client
		want   func(code int, b []byte) bool
	}{
		{"on a fresh connection: the 502", fresh, func(code int, b []byte) bool {
			return code == 502 && bytes.Contains(b, []byte(`"type":"error"`)) && bytes.Contains(b, []byte(`"api_error"`))
		}},
		{"on a kept-alive connection: closed with no answer", http.DefaultClient, func(code int, b []byte) bool {
			return code == 0 && (bytes.Contains(b, []byte("EOF")) || bytes.Contains(b, []byte("reset")))
		}},
	} {
		t.Run("a replica killed mid-request, "+c.name, func(t *testing.T) {
			if c.client == http.DefaultClient {
				ask("warm the kept-alive connection")
			}
			got := make(chan [2]any, 1)
			go func() {
				code, b := askWith(c.client, "hold this one")
				got <- [2]any{code, b}
			}()
			var holder string
			select {
			case holder = <-up.held:
			case <-time.After(10 * time.Second):
				t.Fatal("the held request never reached the upstream")
			}
			replicas[holder].proc.Kill()
			killed[holder] = true
			r := <-got
			if code, b := r[0].(int), r[1].([]byte); !c.want(code, b) {
				t.Fatalf("the request the killed replica served: %d %s", code, b)
			}
			for i := range 20 {
				code, b := ask(fmt.Sprintf("after the kill %d", i))
				if code == 0 {
					// A kept-alive connection HAProxy closed as it was
					// reused: the keep-alive race above, which clients
					// retry once.
					code, b = ask(fmt.Sprintf("after the kill %d, again", i))
				}
				if code != 200 {
					t.Fatalf("request %d after replica %s was killed: %d %s", i, holder, code, b)
				}
			}
		})
	}
	if len(killed) != 2 {
		t.Fatalf("replicas killed: %v; want two of the three left after the drain", killed)
	}
}

// startHAProxy runs haproxy with docs/deploy.md's configuration, its
// server lines replaced by servers and its bind by a free loopback port,
// and returns its URL once every server is up.
func startHAProxy(t *testing.T, bin string, servers []string) string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```haproxy\n(.*?)```").FindSubmatch(doc)
	if m == nil {
		t.Fatal("docs/deploy.md has no haproxy configuration block")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	var out []string
	placed := false
	for _, line := range strings.Split(string(m[1]), "\n") {
		switch {
		case strings.HasPrefix(strings.TrimSpace(line), "server "):
			if !placed {
				out, placed = append(out, servers...), true
			}
		case strings.HasPrefix(strings.TrimSpace(line), "bind "):
			out = append(out, "    bind "+addr)
		default:
			out = append(out, line)
		}
	}
	if !placed {
		t.Fatal("the documented configuration has no server lines")
	}
	cfg := filepath.Join(t.TempDir(), "haproxy.cfg")
	os.WriteFile(cfg, []byte(strings.Join(out, "\n")), 0o644)
	if b, err := exec.Command(bin, "-c", "-f", cfg).CombinedOutput(); err != nil {
		t.Fatalf("haproxy refuses the documented configuration: %v\n%s", err, b)
	}
	cmd := exec.Command(bin, "-db", "-f", cfg)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("haproxy:\n%s", log.String())
		}
	})
	url := "http://" + addr
	// Up once a request is served and the checks had time to pass (rise 2,
	// inter 1s).
	for deadline := time.Now().Add(20 * time.Second); ; {
		if resp, err := http.Get(url + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				time.Sleep(2500 * time.Millisecond)
				return url
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("haproxy did not serve:\n%s", log.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// holdingUpstream answers Anthropic requests at once, counting them by the
// replica whose path they came under, but holds one that says "hold" until
// its connection ends, telling held which replica sent it.
type holdingUpstream struct {
	*httptest.Server
	held chan string
	mu   sync.Mutex
	by   map[string]int
}

func newHoldingUpstream() *holdingUpstream {
	u := &holdingUpstream{held: make(chan string, 1), by: map[string]int{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		from, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		if bytes.Contains(body, []byte("hold this one")) {
			u.held <- from
			<-r.Context().Done() // the replica is gone
			return
		}
		u.mu.Lock()
		u.by[from]++
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{"type":"text","text":"ok"}],`+
			`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":2}}`)
	}))
	return u
}

func (u *holdingUpstream) served(replica string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.by[replica]
}

func (u *holdingUpstream) counts() map[string]int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return maps.Clone(u.by)
}
