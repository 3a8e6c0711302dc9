package main

import (
	"bufio"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Issue "Hardening, third pass", item 11: SIGHUP is logged and ignored,
// never a crash; SIGTERM drains — /readyz answers 503 (draining) while the
// other routes still serve, then the process exits 0.
func TestServeIgnoresSIGHUPAndDrainsOnSIGTERM(t *testing.T) {
	bin := buildImgctx(t)
	cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "IMGCTX_DATA_DIR="+t.TempDir(), "IMGCTX_SERVER_DRAIN_DELAY=2s")
	stdout, _ := cmd.StdoutPipe()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	m := regexp.MustCompile(`listening on (http://\S+)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("serve did not start: %q %s", line, stderr.String())
	}
	get := func(path string) (int, string) {
		resp, err := http.Get(m[1] + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	cmd.Process.Signal(syscall.SIGHUP)
	time.Sleep(200 * time.Millisecond)
	if code, body := get("/readyz"); code != 200 {
		t.Fatalf("after SIGHUP: /readyz %d %s\n%s", code, body, stderr.String())
	}
	cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(300 * time.Millisecond)
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "draining") {
		t.Fatalf("draining: /readyz %d %s", code, body)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("draining: /healthz %d; the other routes must still serve", code)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not exit after draining")
	}
	if !strings.Contains(stderr.String(), "SIGHUP ignored") {
		t.Fatalf("SIGHUP not logged:\n%s", stderr.String())
	}
}
