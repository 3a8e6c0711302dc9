package main

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/internal/config"
)

// readmeCurls returns the curl lines of the README's sh blocks, in order.
func readmeCurls(t *testing.T) []string {
	f, err := os.Open("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "```sh"):
			in = true
		case strings.HasPrefix(line, "```"):
			in = false
		case in && strings.HasPrefix(line, "curl "):
			out = append(out, line)
		}
	}
	return out
}

// The README's curl examples work as written, against a gateway built by
// the same code as `imgctx serve`, with a stand-in upstream.
func TestReadmeCurlExamples(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Skip("curl is not installed")
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if !bytes.Contains(b, []byte("data:image/png;base64,iVBOR")) {
			t.Errorf("the upstream did not get the expanded image: %.200s", b)
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"A dashboard."},"finish_reason":"stop"}],"usage":{"prompt_tokens":1120,"completion_tokens":3}}`)
	}))
	defer up.Close()
	cfg, err := config.Load("", func(string) (string, bool) { return "", false }, map[string]any{
		"data_dir": t.TempDir(), "upstream.base_url": up.URL, "log.level": "error"})
	if err != nil {
		t.Fatal(err)
	}
	a := &app{stdout: io.Discard, stderr: io.Discard, cfg: cfg, log: newLogger(io.Discard, cfg.Log)}
	srv, closeAll, err := a.buildServer(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	gw := httptest.NewServer(srv.Handler())
	defer gw.Close()
	host := strings.TrimPrefix(gw.URL, "http://")

	curls := readmeCurls(t)
	if len(curls) < 5 {
		t.Fatalf("found %d curl examples in the README", len(curls))
	}
	for _, line := range curls {
		cmd := strings.Replace(strings.ReplaceAll(line, "localhost:8080", host), "curl ", "curl --fail-with-body ", 1)
		c := exec.Command("sh", "-c", cmd)
		c.Dir = "../.."
		out, err := c.CombinedOutput()
		if err != nil || len(out) == 0 {
			t.Fatalf("%s\nfailed: %v\n%s", line, err, out)
		}
	}
}
