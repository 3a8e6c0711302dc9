package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/internal/testsvc"
)

// Two `imgctx serve` processes on one PostgreSQL and one S3 bucket behave
// as one gateway: sessions, images and proxied conversations move freely
// between them, and concurrent turns lose nothing.
func TestReplicasShareEverything(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs two imgctx processes")
	}
	dsn := testsvc.Schema(t)
	srv, bucket := testsvc.Bucket(t)
	up := newReplicaUpstream()
	defer up.Close()
	bin := buildImgctx(t)
	env := []string{
		"IMGCTX_SERVER_ADDR=127.0.0.1:0", "IMGCTX_LOG_LEVEL=debug",
		"IMGCTX_UPSTREAM_BASE_URL=" + up.URL, "IMGCTX_UPSTREAM_FORMAT=anthropic",
		"IMGCTX_STORAGE_SESSIONS=postgres", "IMGCTX_STORAGE_POSTGRES_DSN=" + dsn,
		"IMGCTX_STORAGE_IMAGES=s3", "IMGCTX_STORAGE_S3_ENDPOINT=" + srv.Endpoint, "IMGCTX_STORAGE_S3_BUCKET=" + bucket,
		"IMGCTX_STORAGE_S3_PREFIX=imgctx/", "IMGCTX_STORAGE_S3_ACCESS_KEY=" + srv.AccessKey, "IMGCTX_STORAGE_S3_SECRET_KEY=" + srv.SecretKey,
		// The budget at every turn: the agent's turns then remove images,
		// decisions the other replica must find (held images would only
		// leave at a cold cache or the image limit).
		"IMGCTX_KEEP_HOLD=false",
	}
	var a, b *replica
	t.Cleanup(func() {
		// Registered first, so it runs after the replicas have stopped.
		pg, _ := url.Parse(dsn)
		password, _ := pg.User.Password()
		for _, r := range []*replica{a, b} {
			if r == nil {
				continue
			}
			for _, secret := range []string{srv.SecretKey, password} {
				if strings.Contains(r.log.String(), secret) {
					t.Errorf("a replica logged a credential:\n%s", r.log.String())
				}
			}
			if !strings.Contains(r.log.String(), "sessions=postgres images=s3") {
				t.Errorf("the start-up line does not name the backends:\n%.2000s", r.log.String())
			}
		}
	})
	a, b = startReplica(t, bin, env), startReplica(t, bin, env)

	var uploaded struct{ Ref string }
	t.Run("an image uploaded to one is served by the other", func(t *testing.T) {
		shot := screenshot(1)
		up := &uploaded
		postJSON(t, a.url+"/v1/images", "image/png", shot, up)
		resp, err := http.Get(b.url + "/v1/images/" + up.Ref)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Equal(got, shot) {
			t.Fatalf("replica b answered %d with %d bytes; want the %d uploaded to a", resp.StatusCode, len(got), len(shot))
		}
	})

	t.Run("a session started on one continues on the other", func(t *testing.T) {
		var s struct{ ID string }
		postJSON(t, a.url+"/v1/sessions", "application/json", []byte(`{"model":"claude-sonnet-4-6"}`), &s)
		for i, r := range []*replica{a, b, a} {
			body := fmt.Sprintf(`{"messages":[{"role":"user","content":"step %d"}]}`, i)
			postJSON(t, r.url+"/v1/sessions/"+s.ID+"/turn", "application/json", []byte(body), nil)
		}
		if got := sessionUserTexts(t, b.url, s.ID); strings.Join(got, ",") != "step 0,step 1,step 2" {
			t.Fatalf("the log read on b holds %q", got)
		}
	})

	t.Run("a proxied conversation alternating replicas gets the bodies of one replica", func(t *testing.T) {
		one := runAgent(t, up, "one", []*replica{a})
		alt := runAgent(t, up, "alternating", []*replica{a, b})
		if len(one) != len(alt) {
			t.Fatalf("%d upstream requests through one replica, %d alternating", len(one), len(alt))
		}
		markers := 0
		for i := range one {
			if one[i] != alt[i] {
				t.Fatalf("request %d differs:\none replica: %.600s\nalternating: %.600s", i, one[i], alt[i])
			}
			markers += strings.Count(one[i], "[image")
		}
		if markers == 0 {
			t.Fatal("no image was ever removed: the script does not exercise the decisions")
		}
	})

	t.Run("store gc and migrate run on the shared stores", func(t *testing.T) {
		var s struct{ ID string }
		postJSON(t, a.url+"/v1/sessions", "application/json", []byte(`{"model":"claude-sonnet-4-6"}`), &s)
		pasted := base64.StdEncoding.EncodeToString(screenshot(999))
		postJSON(t, b.url+"/v1/sessions/"+s.ID+"/turn", "application/json",
			[]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,`+pasted+`"}}]}]}`), nil)
		cliEnv := func(extra []string, args ...string) string {
			cmd := exec.Command(bin, args...)
			cmd.Env = append(os.Environ(), append(append(env, "IMGCTX_DATA_DIR="+t.TempDir()), extra...)...)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("imgctx %v: %v\n%s", args, err, out)
			}
			return string(out)
		}
		cli := func(args ...string) string { return cliEnv(nil, args...) }
		if out := cli("migrate"); !strings.Contains(out, "the postgres session store is up to date") {
			t.Fatalf("migrate: %s", out)
		}
		// While the proxied conversations above are live, gc deletes
		// nothing they could re-send, whatever --older-than.
		if out := cli("store", "gc", "--older-than", "1ns"); !strings.Contains(out, "proxied conversation(s) are live") || !strings.Contains(out, "removed 0 of") {
			t.Fatalf("gc with live proxied conversations: %s", out)
		}
		// With none live (an expiry that has passed), --older-than holds.
		out := cliEnv([]string{"IMGCTX_PROXY_IDLE_EXPIRY=1ns"}, "store", "gc", "--older-than", "1ns")
		if !strings.Contains(out, "kept 1 still used by a session") {
			t.Fatalf("gc: %s", out)
		}
		get := func(ref string) int {
			resp, err := http.Get(a.url + "/v1/images/" + ref)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		if code := get(uploaded.Ref); code != 404 {
			t.Fatalf("an image no session uses is still served after gc: %d", code)
		}
		if code := get(blob.Of(screenshot(999)).String()); code != 200 {
			t.Fatalf("the image a session's live context holds was collected: %d", code)
		}
	})

	t.Run("50 concurrent turns on ten sessions over both lose nothing", func(t *testing.T) {
		ids := make([]string, 10)
		for i := range ids {
			var s struct{ ID string }
			postJSON(t, a.url+"/v1/sessions", "application/json", []byte(`{"model":"claude-sonnet-4-6"}`), &s)
			ids[i] = s.ID
		}
		var wg sync.WaitGroup
		for j := range 50 {
			r := []*replica{a, b}[j/10%2] // each session's turns alternate
			wg.Go(func() {
				body := fmt.Sprintf(`{"messages":[{"role":"user","content":"turn %02d"}]}`, j)
				postJSON(t, r.url+"/v1/sessions/"+ids[j%10]+"/turn", "application/json", []byte(body), nil)
			})
		}
		wg.Wait()
		for i, id := range ids {
			got := sessionUserTexts(t, []*replica{a, b}[i%2].url, id)
			seen := map[string]bool{}
			for _, s := range got {
				seen[s] = true
			}
			if len(got) != 5 || len(seen) != 5 {
				t.Fatalf("session %d holds %q; want its 5 turns once each", i, got)
			}
			for j := i; j < 50; j += 10 {
				if !seen[fmt.Sprintf("turn %02d", j)] {
					t.Fatalf("session %d lost turn %d: %q", i, j, got)
				}
			}
		}
	})
}

type replica struct {
	url  string
	log  *bytes.Buffer // stderr, complete once the process has stopped
	proc *os.Process
	done chan error // the process's exit, once
}

// wait is the replica's exit: nil for status 0.
func (r *replica) wait(d time.Duration) error {
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(d):
		return fmt.Errorf("still running after %v", d)
	}
}

// buildImgctx builds this command once into the test's directory.
func buildImgctx(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "imgctx")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startReplica runs `imgctx serve` with its own data directory and the
// given settings, and waits for its address.
func startReplica(t *testing.T, bin string, env []string) *replica {
	t.Helper()
	cmd := exec.Command(bin, "serve")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IMGCTX_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, append(env, "IMGCTX_DATA_DIR="+t.TempDir())...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &bytes.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		<-done
		if t.Failed() {
			t.Logf("replica log:\n%s", stderr.String())
		}
	})
	found := make(chan string, 1)
	go func() {
		re := regexp.MustCompile(`listening on (http://\S+)`)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	select {
	case u := <-found:
		return &replica{url: u, log: stderr, proc: cmd.Process, done: done}
	case <-time.After(30 * time.Second):
		t.Fatalf("replica did not start:\n%s", stderr.String())
		return nil
	}
}

func postJSON(t *testing.T, url, contentType string, body []byte, out any) {
	t.Helper()
	resp, err := http.Post(url, contentType, bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		t.Errorf("POST %s: %d %s", url, resp.StatusCode, b)
		return
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Errorf("POST %s: %v in %s", url, err, b)
		}
	}
}

// sessionUserTexts reads a session's export and returns the text of the
// user messages of its log, in order, after checking that its live context
// (what the next turn starts from) holds as many.
func sessionUserTexts(t *testing.T, base, id string) []string {
	t.Helper()
	resp, err := http.Get(base + "/v1/sessions/" + id + "/export")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<24)
	re := regexp.MustCompile(`"role":"user".*?"text":"([^"]*)"`)
	live := -1
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, `{"type":"state"`) {
			live = strings.Count(line, `"role":"user"`)
		}
		if !strings.HasPrefix(line, `{"type":"entry"`) {
			continue
		}
		if m := re.FindStringSubmatch(line); m != nil {
			out = append(out, m[1])
		}
	}
	if live != len(out) {
		t.Errorf("session %s: %d user messages in the log, %d in the live context", id, len(out), live)
	}
	return out
}

// screenshot is a distinct PNG for each i.
func screenshot(i int) []byte {
	img := image.NewRGBA(image.Rect(0, 0, 320, 200))
	for p := range img.Pix {
		img.Pix[p] = byte(i*37 + p%251)
	}
	img.Set(0, 0, color.RGBA{byte(i), 0, 0, 255})
	var buf bytes.Buffer
	png.Encode(&buf, img)
	return buf.Bytes()
}

// replicaUpstream is an Anthropic Messages server whose usage follows the
// body alone (text bytes / 4, 6,000 tokens per image), so two runs that
// send the same bodies get the same answers; it records the bodies of each
// run, named by the client's X-Test-Run header. The sessions API's calls
// (no such header) take 10 ms.
type replicaUpstream struct {
	*httptest.Server
	mu     sync.Mutex
	bodies map[string][]string
}

func newReplicaUpstream() *replicaUpstream {
	u := &replicaUpstream{bodies: map[string][]string{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if run := r.Header.Get("X-Test-Run"); run != "" {
			u.mu.Lock()
			u.bodies[run] = append(u.bodies[run], string(body))
			u.mu.Unlock()
		} else {
			time.Sleep(10 * time.Millisecond) // a turn takes time: concurrent ones overlap
		}
		images := strings.Count(string(body), `"type":"image"`)
		tokens := (len(body)-imageBytes(body))/4 + 6000*images
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"msg_1","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{"type":"text","text":"ok"}],`+
			`"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":%d,"output_tokens":2,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}`, tokens)
	}))
	return u
}

// imageBytes counts the base64 bytes of a body's images.
func imageBytes(body []byte) int {
	n := 0
	for _, m := range regexp.MustCompile(`"data":"([A-Za-z0-9+/=]+)"`).FindAllSubmatch(body, -1) {
		n += len(m[1])
	}
	return n
}

// runAgent plays a computer-use agent through the replicas in turn: three
// human turns, each with four screenshot tool rounds, the full history
// re-sent every time. It returns the bodies the upstream received.
func runAgent(t *testing.T, up *replicaUpstream, run string, replicas []*replica) []string {
	t.Helper()
	var msgs []any
	user := func(content any) { msgs = append(msgs, map[string]any{"role": "user", "content": content}) }
	sent := 0
	send := func() {
		body, _ := json.Marshal(map[string]any{"model": "claude-sonnet-4-6", "max_tokens": 256, "messages": msgs})
		r := replicas[sent%len(replicas)]
		sent++
		req, _ := http.NewRequest("POST", r.url+"/v1/messages", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Imgctx-Session", run)
		req.Header.Set("X-Test-Run", run)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", run, resp.StatusCode, b)
		}
	}
	shot := 0
	for turn := range 3 {
		user(fmt.Sprintf("task %d: look at the screen", turn))
		send()
		for round := range 4 {
			shot++
			id := fmt.Sprintf("call_%d_%d", turn, round)
			msgs = append(msgs, map[string]any{"role": "assistant", "content": []any{
				map[string]any{"type": "tool_use", "id": id, "name": "screenshot", "input": map[string]any{}}}})
			user([]any{map[string]any{"type": "tool_result", "tool_use_id": id, "content": []any{
				map[string]any{"type": "text", "text": fmt.Sprintf("screen %d", shot)},
				map[string]any{"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/png",
					"data": base64.StdEncoding.EncodeToString(screenshot(100 + shot))}}}}})
			send()
		}
		msgs = append(msgs, map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "text", "text": "done"}}})
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	return up.bodies[run]
}
