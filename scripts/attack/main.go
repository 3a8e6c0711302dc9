// Command attack replays the denial-of-service attacks of the hardening
// issue against a real `imgctx serve` on loopback and prints what they
// cost and what another tenant saw. Every loop is bounded in count and
// time; nothing leaves 127.0.0.1.
//
//		go run ./scripts/attack        # about two minutes
//		go run ./scripts/attack -only 5  # one of them
//
//	 1. stalled bodies: 64 connections of tenant alpha promise 32 MB and send
//	    8 bytes; tenant beta sends requests meanwhile.
//	 2. decode bomb: 25 valid 6000×6000 PNGs to an Anthropic model (more than
//	    20 images: the 2000 px rule makes imgctx shrink them).
//	 3. many small messages: 1,000,000 {"role":"user","content":"a"} (30 MB).
//	 4. memory under load: 100 clients sending 5 MB requests at once.
//	 5. decode load: 6 clients of two tenants at once, each sending 21
//	    distinct 2500×2500 PNGs to an Anthropic model (the 2000 px rule makes
//	    imgctx shrink every one), three requests each: peak RSS is checked
//	    against the bound docs/config.md gives for media.shrink_memory (the
//	    command exits 1 past it).
//	 6. compression bombs: 48 clients of two tenants at once, each a body
//	    of 100 MB gzipped to about 100 KB: peak RSS is checked against
//	    server.max_inflight_bytes' bound (the command exits 1 past it).
//
// For each: the status the attacker got, the gateway's CPU seconds and
// peak RSS (from /proc), and for 1 beta's successes.
package main

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"flag"
	"fmt"
	"hash/crc32"
	"image"
	"image/color"
	"image/png"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

func main() {
	only := flag.Int("only", 0, "run only this attack (1–6)")
	flag.Parse()
	run := func(n int) bool { return *only == 0 || *only == n }
	dir, err := os.MkdirTemp("", "attack")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	up := listen(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if strings.HasPrefix(r.URL.Path, "/v1/messages") {
			io.WriteString(w, `{"id":"m","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":1,"output_tokens":1}}`)
			return
		}
		io.WriteString(w, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1}}`)
	}))
	bin := filepath.Join(dir, "imgctx")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/imgctx").CombinedOutput(); err != nil {
		log.Fatalf("build: %v\n%s", err, out)
	}
	cfg := filepath.Join(dir, "imgctx.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("upstreams:\n  - {name: a, format: anthropic, base_url: %q}\n  - {name: o, format: openai, base_url: %q}\n", up, up)), 0o644)
	// Each attack gets a fresh gateway, so its peak RSS is its own.
	start := func() (base string, pid int, stop func()) {
		gw := exec.Command(bin, "serve", "--config", cfg, "--addr", "127.0.0.1:0")
		gw.Env = append(os.Environ(), "IMGCTX_DATA_DIR="+filepath.Join(dir, "data"), "IMGCTX_LOG_LEVEL=error",
			"IMGCTX_AUTH_KEYS=ka=alpha,kb=beta", "IMGCTX_SERVER_BODY_TIMEOUT=3s")
		out, _ := gw.StdoutPipe()
		gw.Stderr = os.Stderr
		if err := gw.Start(); err != nil {
			log.Fatal(err)
		}
		line := make([]byte, 256)
		n, _ := out.Read(line)
		m := regexp.MustCompile(`listening on (http://\S+)`).FindSubmatch(line[:n])
		if m == nil {
			log.Fatalf("imgctx did not start: %s", line[:n])
		}
		return string(m[1]), gw.Process.Pid, func() { gw.Process.Kill(); gw.Wait() }
	}

	fmt.Println("| attack | what the attacker got | gateway CPU | gateway peak RSS | another tenant |")
	fmt.Println("|---|---|---|---|---|")

	var base string
	var pid int
	stop := func() {}
	var wg sync.WaitGroup
	var mu sync.Mutex
	if run(1) {
		// 1. Stalled bodies.
		base, pid, stop = start()
		cpu0 := cpu(pid)
		var conns []net.Conn
		for range 64 {
			c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
			if err != nil {
				log.Fatal(err)
			}
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ka\r\nContent-Type: application/json\r\nContent-Length: 33554432\r\n\r\n{\"model\"")
			conns = append(conns, c)
		}
		time.Sleep(200 * time.Millisecond)
		ok, tries := 0, 0
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); tries++ {
			if code := post(base, "/v1/chat/completions", "kb", []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)); code == 200 {
				ok++
			}
			time.Sleep(20 * time.Millisecond)
		}
		statuses := map[string]int{}
		for _, c := range conns {
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			b := make([]byte, 12)
			k, _ := io.ReadFull(c, b)
			statuses[strings.TrimSpace(string(b[min(9, k):k]))]++
			c.Close()
		}
		fmt.Printf("| 64 stalled 32 MB bodies (alpha) | %v | %.2f s | %s | beta: %d of %d requests answered 200 |\n", statuses, (cpu(pid) - cpu0).Seconds(), rss(pid), ok, tries)

		stop()
	}

	if run(2) {
		// 2. Decode bomb.
		base, pid, stop = start()
		bomb := bigPNG(6000)
		var blocks []string
		for i := range 25 {
			blocks = append(blocks, `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"`+base64.StdEncoding.EncodeToString(distinct(bomb, i))+`"}}`)
		}
		body := []byte(`{"model":"claude-sonnet-4-6","max_tokens":10,"messages":[{"role":"user","content":[` + strings.Join(blocks, ",") + `]}]}`)
		cpu0, began := cpu(pid), time.Now()
		code := post(base, "/v1/messages", "ka", body)
		fmt.Printf("| 25 × 6000×6000 PNG, %d KB each (%.1f MB) | %d in %.1f s | %.2f s | %s | |\n", len(bomb)>>10, float64(len(body))/1e6, code, time.Since(began).Seconds(), (cpu(pid) - cpu0).Seconds(), rss(pid))
		stop()
	}

	if run(3) {
		// 3. Many small messages.
		base, pid, stop = start()
		many := []byte(`{"model":"gpt-4o","messages":[` + strings.Repeat(`{"role":"user","content":"a"},`, 999_999) + `{"role":"user","content":"a"}]}`)
		cpu0, began := cpu(pid), time.Now()
		code := post(base, "/v1/chat/completions", "ka", many)
		fmt.Printf("| 1,000,000 one-letter messages (%.0f MB) | %d in %.2f s | %.2f s | %s | |\n", float64(len(many))/1e6, code, time.Since(began).Seconds(), (cpu(pid) - cpu0).Seconds(), rss(pid))
		stop()
	}

	if run(4) {
		// 4. Memory under load.
		shot := bigPNG(1600)
		var parts []string
		for len(strings.Join(parts, ",")) < 5<<20 {
			parts = append(parts, `{"type":"image_url","image_url":{"url":"data:image/png;base64,`+base64.StdEncoding.EncodeToString(distinct(shot, 100+len(parts)))+`"}}`)
		}
		heavy := []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":[` + strings.Join(parts, ",") + `]}]}`)
		base, pid, stop = start()
		cpu0 := cpu(pid)
		codes := map[int]int{}
		for i := range 100 {
			key := "ka"
			if i%2 == 1 {
				key = "kb"
			}
			wg.Go(func() {
				c := post(base, "/v1/chat/completions", key, heavy)
				mu.Lock()
				codes[c]++
				mu.Unlock()
			})
		}
		wg.Wait()
		fmt.Printf("| 100 clients × %.1f MB at once | %v | %.2f s | %s | |\n", float64(len(heavy))/1e6, codes, (cpu(pid) - cpu0).Seconds(), rss(pid))
		stop()
	}

	if run(6) {
		compressionBombs(start)
	}

	if run(5) {
		// 5. Decode load.
		base, pid, stop = start()
		defer stop()
		idle := peakMB(pid)
		side := bigPNG(2500)
		cpu0, began := cpu(pid), time.Now()
		codes := map[int]int{}
		bodies := 0
		for c := range 6 {
			key := []string{"ka", "kb"}[c%2]
			var blocks []string
			for i := range 21 {
				blocks = append(blocks, `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"`+base64.StdEncoding.EncodeToString(distinct(side, 1000+c*100+i))+`"}}`)
			}
			body := []byte(`{"model":"claude-sonnet-4-6","max_tokens":10,"messages":[{"role":"user","content":[` + strings.Join(blocks, ",") + `]}]}`)
			bodies += len(body)
			wg.Go(func() {
				for range 3 {
					code := post(base, "/v1/messages", key, body)
					mu.Lock()
					codes[code]++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		// docs/config.md, media.shrink_memory: the gateway's own, the bodies in
		// flight, the decodes' bound, and the collector's headroom (twice what
		// is live).
		bound := idle + 2*(bodies>>20) + 2*(512+256)
		peak := peakMB(pid)
		fmt.Printf("| 6 clients × 3 × 21 × 2500×2500 PNG (%.1f MB a request) at once | %v in %.1f s | %.2f s | %d MB (bound %d MB) | |\n",
			float64(bodies)/6e6, codes, time.Since(began).Seconds(), (cpu(pid) - cpu0).Seconds(), peak, bound)
		if peak > bound {
			stop()
			log.Fatalf("decode load: peak RSS %d MB over the documented bound %d MB", peak, bound)
		}
	}
}

// compressionBombs is attack 6: bodies admitted by their length on the
// wire, held at what they decompress to.
func compressionBombs(start func() (string, int, func())) {
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write([]byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"`))
	chunk := bytes.Repeat([]byte("a"), 1<<20)
	for range 100 {
		zw.Write(chunk)
	}
	zw.Write([]byte(`"}]}`))
	zw.Close()
	bomb := z.Bytes()
	base, pid, stop := start()
	defer stop()
	idle, cpu0 := peakMB(pid), cpu(pid)
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	for i := range 48 {
		key := []string{"ka", "kb"}[i%2]
		wg.Go(func() {
			code := post(base, "/v1/chat/completions", key, bomb, "Content-Encoding", "gzip")
			mu.Lock()
			codes[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	// docs/config.md, server.max_inflight_bytes: peak memory near 2.6 ×
	// the bound (256 MB), over the gateway's own.
	peak, bound := peakMB(pid), idle+3*256
	fmt.Printf("| 48 clients × a %.0f KB gzip body of 100 MB at once | %v | %.2f s | %d MB (bound %d MB) | |\n",
		float64(len(bomb))/1e3, codes, (cpu(pid) - cpu0).Seconds(), peak, bound)
	if peak > bound {
		stop() // log.Fatalf runs no deferred call: the gateway would outlive the command
		log.Fatalf("compression bombs: peak RSS %d MB over the bound %d MB", peak, bound)
	}
}

// peakMB is the process's peak resident memory so far, in MB.
func peakMB(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmHWM:") {
			kb, _ := strconv.Atoi(strings.Fields(l)[1])
			return kb >> 10
		}
	}
	return 0
}

func listen(h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go http.Serve(ln, h)
	return "http://" + ln.Addr().String()
}

var client = &http.Client{Timeout: 2 * time.Minute}

// post sends body with key, and header's pairs; it returns the status (0
// when none came).
func post(base, path, key string, body []byte, header ...string) int {
	req, _ := http.NewRequest("POST", base+path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("anthropic-version", "2023-06-01")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// cpu is the process's user+system time.
func cpu(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100)
}

// rss is the process's peak resident memory so far (VmHWM).
func rss(pid int) string { return fmt.Sprintf("%d MB", peakMB(pid)) }

// bigPNG is a side×side PNG of gentle gradients: valid, small on disk,
// huge once decoded.
func bigPNG(side int) []byte {
	img := image.NewRGBA(image.Rect(0, 0, side, side))
	for y := range side {
		for x := range side {
			img.SetRGBA(x, y, color.RGBA{uint8(x / 64), uint8(y / 64), 128, 255})
		}
	}
	var buf bytes.Buffer
	png.Encode(&buf, img)
	return buf.Bytes()
}

// distinct inserts a text chunk naming n before the PNG's IEND.
func distinct(p []byte, n int) []byte {
	iend := bytes.LastIndex(p, []byte("IEND")) - 4
	body := append([]byte("tEXtn\x00"), strconv.Itoa(n)...)
	chunk := append([]byte{0, 0, 0, byte(len(body) - 4)}, body...)
	crc := crc32.ChecksumIEEE(body)
	chunk = append(chunk, byte(crc>>24), byte(crc>>16), byte(crc>>8), byte(crc))
	return append(append(append([]byte(nil), p[:iend]...), chunk...), p[iend:]...)
}
