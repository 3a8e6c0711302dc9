package gateway

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/imgctx/imgctx/internal/testsvc"
	"github.com/imgctx/imgctx/session"
)

// uiRig is a scripted computer-use conversation of tenant alpha through a
// gateway with the request log and the dashboard on: six screenshots, a
// budget of one, so the next turn removes the older ones (reason budget).
func uiRig(t *testing.T) (*agentRig, *agent) {
	rig := newAgentRig(t, 20_000, &session.Mem{})
	rig.keys = map[string]string{"key-a": "alpha", "key-b": "beta"}
	rig.cfg = Config{RequestLog: true, UI: true, UIAdminKey: "admin-secret", Version: "test"}
	rig.restart(t)
	g := newAgent(t, rig, "Open the login page.")
	g.header["Authorization"] = "Bearer key-a"
	g.start()
	for range 3 {
		g.send(reply{tools: 1})
		g.results(2, false, false)
	}
	g.send(reply{})
	g.human("And now?")
	g.send(reply{})
	rig.done.wait() // the last line is recorded after its answer is the client's
	rig.server.reqlog.Flush()
	return rig, g
}

func basic(key string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte("me:"+key)) }

func uiGet(t *testing.T, rig *agentRig, path string, header ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", rig.srv.URL+path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp, b.String()
}

// The dashboard is its tenant's only, to loopback clients or the admin
// key: tenant beta sees none of alpha's conversations, requests or
// thumbnails, a request through a proxy needs the admin key (which
// shows the tenant asked for, else the first by name), and with
// auth.keys a key is asked for, as Basic auth's password or a Bearer.
func TestUIAccess(t *testing.T) {
	rig, g := uiRig(t)
	lines, _ := rig.sessions.ListRequests(t.Context(), session.RequestFilter{Tenant: "alpha"})
	if len(lines) == 0 {
		t.Fatal("no lines for alpha")
	}
	conv := lines[0].Conversation
	var ref string
	for _, img := range lines[0].Images {
		if img.Sent {
			ref = img.Ref.String()
		}
	}
	// What the model saw at the last request: as many messages as it sent,
	// its one image and its markers in place.
	_, saw := uiGet(t, rig, "/ui/conversations/"+conv+"/requests/"+lines[0].ID, "Authorization", basic("key-a"))
	if n, want := strings.Count(saw, `<li class="msg `), len(g.msgs)-1; n != want || strings.Count(saw, `class="thumb"`) != 1 || strings.Count(saw, "image removed") != 5 {
		t.Errorf("what the model saw: %d messages (it sent %d), %d images, %d markers", n, want, strings.Count(saw, `class="thumb"`), strings.Count(saw, "image removed"))
	}
	for _, c := range []struct {
		path   string
		header []string
		status int
		has    string
	}{
		{"/ui", nil, 401, "an API key is needed"},
		{"/ui", []string{"Authorization", basic("key-a")}, 200, `id="requests">` + fmt.Sprint(len(lines)) + `<`},
		{"/ui", []string{"Authorization", basic("key-b")}, 200, `id="requests">0<`},
		{"/ui/conversations", []string{"Authorization", basic("key-b")}, 200, "no conversation yet"},
		{"/ui/conversations/" + conv, []string{"Authorization", basic("key-a")}, 200, "budget"},
		{"/ui/conversations/" + conv, []string{"Authorization", basic("key-b")}, 404, "no such conversation"},
		{"/ui/thumbs/" + ref, []string{"Authorization", basic("key-a")}, 200, ""},
		{"/ui/thumbs/" + ref, []string{"Authorization", basic("key-b")}, 404, "no such image"},
		{"/ui", []string{"Authorization", basic("key-a"), "X-Forwarded-For", "203.0.113.9"}, 403, "ui.admin_key"},
		{"/ui?tenant=alpha", []string{"Authorization", basic("admin-secret"), "X-Forwarded-For", "203.0.113.9"}, 200, `id="requests">` + fmt.Sprint(len(lines)) + `<`},
		{"/ui/thumbs/" + ref + "?tenant=beta", []string{"Authorization", basic("admin-secret")}, 404, ""},
		{"/ui?tenant=beta", []string{"Authorization", "Bearer admin-secret"}, 200, `id="requests">0<`},
		{"/ui", []string{"Authorization", "Bearer admin-secret"}, 200, `id="requests">` + fmt.Sprint(len(lines)) + `<`}, // the first tenant by name
		{"/ui", []string{"Authorization", "Bearer key-a"}, 200, `id="requests">` + fmt.Sprint(len(lines)) + `<`},
		{"/ui", []string{"Authorization", basic("wrong")}, 401, ""},
	} {
		resp, body := uiGet(t, rig, c.path, c.header...)
		if resp.StatusCode != c.status || !strings.Contains(body, c.has) {
			t.Errorf("GET %s %v: %d, want %d with %q:\n%.300s", c.path, c.header, resp.StatusCode, c.status, c.has, body)
		}
	}
}

// The dashboard in a real browser: headless Chromium loads the overview
// and the conversation of a scripted agent run and shows what a person
// reads there — the request count and the dollars the request log holds,
// the removed image's reason and its marker, a thumbnail that decodes —
// and "what the model saw" with the marker in place. The screenshots are
// kept (the path is logged).
func TestUIInABrowser(t *testing.T) {
	chromium := testsvc.Chromium(t)
	rig, _ := uiRig(t)
	lines, _ := rig.sessions.ListRequests(t.Context(), session.RequestFilter{Tenant: "alpha"})
	total := 0.0
	for _, l := range lines {
		total += l.Dollars
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1280, 1600))
	actx, cancel := chromedp.NewExecAllocator(t.Context(), opts...)
	defer cancel()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	// The first call starts the browser, on a context without a deadline
	// (a deadline there would stop the browser); the steps get one.
	if _, err := chromedp.Call(bctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(bctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": basic("key-a")}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	defer cancel()
	dir := filepath.Join(os.TempDir(), "imgctx-ui-screenshots")
	os.MkdirAll(dir, 0o755)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		must(err)
		must(os.WriteFile(filepath.Join(dir, name), png, 0o644))
	}
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		must(err)
		return strings.TrimSpace(v)
	}
	must(chromedp.Do(ctx, chromedp.Navigate(rig.srv.URL+"/ui")))
	requests, dollars, tenant := text("#requests"), text("#dollars"), text("#tenant")
	shot("overview.png")
	must(chromedp.Do(ctx, chromedp.Navigate(rig.srv.URL+"/ui/conversations"), chromedp.Click(chromedp.CSS("a.conv")), chromedp.WaitVisible(chromedp.CSS("#timeline"))))
	markers, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#timeline .marker')].map(e => e.textContent)`))
	must(err)
	reasons, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#timeline .marker .reason')].map(e => e.textContent)`))
	must(err)
	decoded, err := chromedp.Run(ctx, chromedp.Evaluate[int](`Promise.all([...document.querySelectorAll('#timeline img.thumb')].map(i => i.decode().then(() => i.naturalWidth > 0 ? 1 : 0, () => 0))).then(r => r.reduce((a, b) => a + b, 0))`, chromedp.EvalAwaitPromise))
	must(err)
	thumbs, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#timeline img.thumb').length`))
	must(err)
	shot("conversation.png")
	must(chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#timeline li:last-child a.saw")), chromedp.WaitVisible(chromedp.CSS("#saw"))))
	sawMarkers, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#saw .marker').length`))
	must(err)
	shot("saw.png")
	t.Logf("screenshots in %s", dir)
	if requests != fmt.Sprint(len(lines)) || tenant != "alpha" {
		t.Errorf("overview: %q requests (the log has %d), tenant %q", requests, len(lines), tenant)
	}
	if want := fmt.Sprintf("$%.4f", total); dollars != want {
		t.Errorf("overview dollars %q, the request log sums to %s", dollars, want)
	}
	if len(markers) == 0 || !strings.Contains(strings.Join(markers, " "), "image removed") || !strings.Contains(strings.Join(reasons, " "), "budget") {
		t.Errorf("the removed images' markers: %q (reasons %q)", markers, reasons)
	}
	if thumbs == 0 || decoded != thumbs {
		t.Errorf("%d of %d thumbnails decoded in the browser", decoded, thumbs)
	}
	if sawMarkers == 0 {
		t.Errorf("what the model saw at the last request shows no marker")
	}
}

// A client that is not on this machine gets a 403 without the admin key,
// whatever tenant key it shows; with it, the dashboard.
func TestUIRefusesRemoteClients(t *testing.T) {
	rig, _ := uiRig(t)
	h := rig.server.Handler()
	for _, c := range []struct {
		key    string
		status int
	}{{"key-a", 403}, {"", 403}, {"admin-secret", 200}} {
		req := httptest.NewRequest("GET", "/ui?tenant=alpha", nil) // from 192.0.2.1
		if c.key != "" {
			req.Header.Set("Authorization", basic(c.key))
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != c.status {
			t.Errorf("remote client with key %q: %d, want %d", c.key, rec.Code, c.status)
		}
	}
}
