// Command filesbench measures what file ids (upstream.file_ids) save on a
// slow uplink: a scripted computer-use conversation (the simulator's
// real-weight screenshots, one more each request, every one kept) through
// two imgctx serve processes, one with file ids off and one with them on,
// each reaching an Anthropic-shaped provider with a Files API through a
// TCP relay that shapes the gateway's uplink (default 50 Mbit/s). Per
// request it prints the bytes the relay carried upstream (uploads
// included) and the time to the answer's first byte at the client, side
// by side.
//
//	go run ./scripts/filesbench [-requests 30] [-mbit 50]
package main

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"flag"
	"fmt"
	"io"
	"log"
	"mime"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/imgctx/imgctx/sim"
)

func main() {
	requests := flag.Int("requests", 30, "requests in the conversation (one screenshot more each)")
	mbit := flag.Float64("mbit", 50, "the gateway's uplink to the provider, Mbit/s")
	flag.Parse()

	w, err := sim.Build("computer-use", sim.DefaultParams("computer-use"))
	if err != nil {
		log.Fatal(err)
	}
	var shots []string
	for _, im := range w.Images {
		if im.Origin == "tool" && len(shots) < *requests {
			shots = append(shots, im.B64)
		}
	}
	mean := 0
	for _, s := range shots {
		mean += base64.StdEncoding.DecodedLen(len(s))
	}
	mean /= len(shots)

	dir, err := os.MkdirTemp("", "filesbench")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "imgctx")
	fmt.Fprintln(os.Stderr, "building imgctx…")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/imgctx").CombinedOutput(); err != nil {
		log.Fatalf("build: %v\n%s", err, out)
	}
	prov := startProvider()
	rates := []string{"off", "auto"}
	relays := map[string]*relay{}
	gws := map[string]*exec.Cmd{}
	urls := map[string]string{}
	for _, mode := range rates {
		relays[mode] = startRelay(prov, *mbit)
		cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0")
		cmd.Env = append(os.Environ(), "IMGCTX_DATA_DIR="+filepath.Join(dir, mode), "IMGCTX_LOG_LEVEL=warn",
			"IMGCTX_UPSTREAM_FORMAT=anthropic", "IMGCTX_UPSTREAM_BASE_URL=http://"+relays[mode].addr, "IMGCTX_UPSTREAM_FILE_IDS="+mode,
			"IMGCTX_SERVER_MAX_BODY_BYTES=268435456")
		urls[mode] = start(cmd)
		gws[mode] = cmd
	}
	defer func() {
		for _, c := range gws {
			c.Process.Kill()
			c.Wait()
		}
	}()

	fmt.Printf("filesbench: %d requests, one %d-byte screenshot more each (the simulator's computer-use images), uplink shaped to %g Mbit/s\n\n",
		len(shots), mean, *mbit)
	fmt.Printf("%8s  %14s  %14s  %12s  %12s\n", "request", "upstream bytes", "", "first byte", "")
	fmt.Printf("%8s  %14s  %14s  %12s  %12s\n", "", "base64", "file ids", "base64", "file ids")
	var total [2]int64
	var ttfb [2]time.Duration
	for n := 1; n <= len(shots); n++ {
		body := conversation(shots[:n])
		var bytes [2]int64
		var first [2]time.Duration
		for i, mode := range rates {
			before := relays[mode].up.Load()
			first[i] = post(urls[mode], body)
			bytes[i] = relays[mode].up.Load() - before
			total[i] += bytes[i]
			ttfb[i] += first[i]
		}
		fmt.Printf("%8d  %14d  %14d  %12s  %12s\n", n, bytes[0], bytes[1], ms(first[0]), ms(first[1]))
	}
	fmt.Printf("%8s  %14d  %14d  %12s  %12s\n", "total", total[0], total[1], ms(ttfb[0]), ms(ttfb[1]))
	fmt.Printf("\nthe provider received %d uploads for %d screenshots\n", prov.uploads.Load(), len(shots))
}

// conversation is the client's request after n screenshots: each a user
// message of a line of text and the screenshot, the model's short answer
// between them.
func conversation(shots []string) []byte {
	var msgs []string
	for i, s := range shots {
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":[{"type":"text","text":"step %d: the screen now"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"%s"}}]}`, i, s))
		if i < len(shots)-1 {
			msgs = append(msgs, fmt.Sprintf(`{"role":"assistant","content":[{"type":"text","text":"clicked %d"}]}`, i))
		}
	}
	return []byte(`{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[` + strings.Join(msgs, ",") + `]}`)
}

var client = &http.Client{Timeout: 10 * time.Minute, Transport: &http.Transport{DisableCompression: true}}

// post sends one request and returns the time to the answer's first byte.
func post(base string, body []byte) time.Duration {
	req, _ := http.NewRequest("POST", base+"/v1/messages", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", "sk-bench")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	var one [1]byte
	io.ReadFull(resp.Body, one[:])
	d := time.Since(start)
	rest, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		log.Fatalf("%s: status %d: %s%s", base, resp.StatusCode, one[:], rest)
	}
	return d
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/1e6) }

var listening = regexp.MustCompile(`listening on (http://\S+)`)

// start runs imgctx serve and returns its address.
func start(cmd *exec.Cmd) string {
	out, err := cmd.StdoutPipe()
	if err != nil {
		log.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	select {
	case u := <-found:
		return u
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		log.Fatal("imgctx did not start")
	}
	return ""
}

// provider answers Anthropic Messages at once and keeps uploaded files.
type provider struct {
	addr    string
	mu      sync.Mutex
	files   map[string]bool
	uploads atomic.Int64
}

func startProvider() *provider {
	p := &provider{files: map[string]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	p.addr = ln.Addr().String()
	go http.Serve(ln, http.HandlerFunc(p.handle))
	return p
}

var fileRef = regexp.MustCompile(`"file_id":"([^"]+)"`)

func (p *provider) handle(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/v1/files" {
		_, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		form, err := multipart.NewReader(bytes.NewReader(body), params["boundary"]).ReadForm(64 << 20)
		if err != nil || len(form.File["file"]) != 1 {
			http.Error(w, "no file", 400)
			return
		}
		n := p.uploads.Add(1)
		id := fmt.Sprintf("file_bench_%d", n)
		p.mu.Lock()
		p.files[id] = true
		p.mu.Unlock()
		fmt.Fprintf(w, `{"id":%q,"type":"file"}`, id)
		return
	}
	for _, m := range fileRef.FindAllSubmatch(body, -1) {
		p.mu.Lock()
		ok := p.files[string(m[1])]
		p.mu.Unlock()
		if !ok {
			w.WriteHeader(404)
			fmt.Fprintf(w, `{"type":"error","error":{"type":"not_found_error","message":"File not found: %s"}}`, m[1])
			return
		}
	}
	io.WriteString(w, `{"id":"m","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":10,"output_tokens":1}}`)
}

// relay forwards TCP connections to the provider, the direction toward
// it shaped to a rate (a token bucket in 16 KB steps), and counts the
// bytes it carried that way.
type relay struct {
	addr string
	up   atomic.Int64
}

func startRelay(p *provider, mbit float64) *relay {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	r := &relay{addr: ln.Addr().String()}
	perByte := time.Duration(float64(time.Second) * 8 / (mbit * 1e6))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", p.addr)
				if err != nil {
					return
				}
				defer u.Close()
				go io.Copy(c, u)
				buf := make([]byte, 16<<10)
				next := time.Now()
				for {
					n, err := c.Read(buf)
					if n > 0 {
						next = next.Add(time.Duration(n) * perByte)
						if now := time.Now(); next.After(now) {
							time.Sleep(next.Sub(now))
						} else {
							next = now // idle time does not bank credit
						}
						r.up.Add(int64(n))
						if _, err := u.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return r
}
