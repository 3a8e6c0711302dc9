// Command abmeter measures what imgctx serve adds to a request, through
// real processes on loopback, side by side with httputil.ReverseProxy in
// the same run. It starts three processes — a scripted upstream, a plain
// ReverseProxy in front of it, and imgctx serve in front of it — and sends
// the same agent-shaped requests to each in turn (direct, via the
// ReverseProxy, via imgctx; the order rotates every request), then reports
// the p50/p99 each adds over direct, the CPU each proxy process spends per
// request (from /proc), and requests/s under concurrent load: every client
// re-sending one body (one conversation), and each a conversation of its own.
//
//	go run ./scripts/abmeter              # the full run, about two minutes
//	go run ./scripts/abmeter -n 100 -load 3s
//	go run ./scripts/abmeter -scaleout       # SQLite + directory vs PostgreSQL + S3, one and two replicas
//	go run ./scripts/abmeter -growth -n 100  # the growth table: 50 to 3,200 messages, 0 to 100 screenshots
//	go run ./scripts/abmeter -growth -n 50 -client-rate 100  # the same from a client sending 100 MB/s
//	go run ./scripts/abmeter -rss 16 -load 20s  # peak RSS under 16 clients sending the agent body
//	go run ./scripts/abmeter -soak 10m -rss 16  # RSS over ten minutes of growing conversations; exit 1 if imgctx's grows
//
// The ReverseProxy keeps 64 idle connections to the upstream (-rp-idle),
// as a production one would; Go's default of 2 made it look slower.
//
// Bodies: "agent" is an OpenAI-format history of 200 text messages with
// tool calls and 6 inline 1280×800 screenshots (≈2.2 MB), re-sent
// unchanged, and growing by one round a request as agents send it (41 to
// 50 rounds, then again); "agent-ref" is the same history naming the screenshots by imgctx: ref
// (direct and ReverseProxy get the inline body, which is what the upstream
// receives either way); "agent-pretty" is the agent body pretty-printed;
// "small" is a 1 KB text request; the growing history is sent once more
// asking for a stream, which the scripted upstream answers in five events,
// the time taken to the last. Every request and run is bounded.
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/imgctx/imgctx/internal/bodies"
)

func main() {
	role := flag.String("role", "", "internal: upstream or rproxy")
	target := flag.String("target", "", "internal: the ReverseProxy's upstream")
	n := flag.Int("n", 200, "requests per body shape and target")
	load := flag.Duration("load", 5*time.Second, "duration of each throughput run")
	scale := flag.Bool("scaleout", false, "measure the storage set-ups instead: SQLite + directory, PostgreSQL + S3 with one and two replicas (needs scripts/testservices)")
	grow := flag.Bool("growth", false, "measure the growth table instead: histories of 50 to 3,200 messages and 0 to 100 screenshots, growing")
	rss := flag.Int("rss", 0, "measure each proxy's peak RSS instead, under this many clients sending the agent body (for -load), and its RSS after 70 s idle")
	soakFor := flag.Duration("soak", 0, "soak instead: -rss clients (16 if unset) a proxy in growing conversations for this long, RSS sampled; exit 1 if imgctx's grows")
	soakIdle := flag.Duration("soak-idle", 0, "with -soak: then wait this long with no traffic and print the RSS again (6m: past the five minutes a conversation's held request is kept)")
	idle := flag.Int("rp-idle", 64, "internal: the ReverseProxy's idle connections to the upstream")
	rate := flag.Float64("client-rate", 0, "pace every request body the meter sends to this many MB/s (0: as fast as loopback takes it): a client on a slower link")
	flag.Parse()
	clientRate = *rate * 1e6
	switch *role {
	case "upstream":
		serve(http.HandlerFunc(upstream))
	case "rproxy":
		u, err := url.Parse(*target)
		if err != nil {
			log.Fatal(err)
		}
		rp := httputil.NewSingleHostReverseProxy(u)
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConns, t.MaxIdleConnsPerHost = *idle, *idle
		rp.Transport = t
		serve(rp)
	case "":
		switch {
		case *scale:
			scaleout(*n, *load)
			return
		case *grow:
			growth(*n)
			return
		case *soakFor > 0:
			if soak(cmp.Or(*rss, 16), *soakFor, *soakIdle) {
				os.Exit(1)
			}
			return
		case *rss > 0:
			memory(*rss, *load)
			return
		}
		run(*n, *load)
	default:
		log.Fatalf("unknown role %q", *role)
	}
}

// serve listens on a loopback port and tells the parent which.
func serve(h http.Handler) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("listening on http://%s\n", ln.Addr())
	log.Fatal(http.Serve(ln, h))
}

const completion = `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":{"role":"assistant","content":"Done."},"finish_reason":"stop"}],"usage":{"prompt_tokens":9000,"completion_tokens":2,"total_tokens":9002}}`

// streamed is the same answer as server-sent events, in pieces flushed
// one by one, the usage last (stream_options.include_usage).
var streamed = []string{
	`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":"Do"},"finish_reason":null}]}`,
	`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":"ne."},"finish_reason":null}]}`,
	`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
	`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":9000,"completion_tokens":2,"total_tokens":9002}}`,
	`[DONE]`,
}

// streamFlag begins a body that asks for a stream (streamedBody).
const streamFlag = `{"stream":true,`

func upstream(w http.ResponseWriter, r *http.Request) {
	head := make([]byte, len(streamFlag))
	n, _ := io.ReadFull(r.Body, head)
	io.Copy(io.Discard, r.Body)
	if string(head[:n]) != streamFlag {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, completion)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for _, ev := range streamed {
		io.WriteString(w, "data: "+ev+"\n\n")
		w.(http.Flusher).Flush()
	}
}

// streamedBody is body (a JSON object) asking for a streamed answer.
func streamedBody(body []byte) []byte {
	return append([]byte(streamFlag), body[1:]...)
}

// proc is a child process and its address.
type proc struct {
	name string
	cmd  *exec.Cmd
	url  string
}

func start(name string, cmd *exec.Cmd, re *regexp.Regexp) *proc {
	out, err := cmd.StdoutPipe()
	if err != nil {
		log.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		log.Fatalf("%s: %v", name, err)
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if m := re.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	select {
	case u := <-found:
		return &proc{name: name, cmd: cmd, url: u}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		log.Fatalf("%s did not start", name)
	}
	return nil
}

// cpu is the process's user+system CPU time so far.
func (p *proc) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ
}

var client = &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}}

// clientRate, when above zero, paces every request body the meter sends
// to that many bytes a second (-client-rate): a client on a slower link
// than loopback.
var clientRate float64

func post(base, path string, body []byte) (time.Duration, error) {
	start := time.Now()
	var rd io.Reader = bytes.NewReader(body)
	if clientRate > 0 {
		rd = &paced{rest: body, start: start}
	}
	req, err := http.NewRequest(http.MethodPost, base+path, rd)
	if err != nil {
		return 0, err
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, fmt.Errorf("%s: status %d", base, resp.StatusCode)
	}
	return time.Since(start), nil
}

// paced gives out a body no faster than clientRate, 64 KB at a time.
type paced struct {
	rest  []byte
	sent  int
	start time.Time
}

func (p *paced) Read(b []byte) (int, error) {
	if len(p.rest) == 0 {
		return 0, io.EOF
	}
	time.Sleep(time.Until(p.start.Add(time.Duration(float64(p.sent) / clientRate * float64(time.Second)))))
	n := copy(b[:min(len(b), 64<<10)], p.rest)
	p.rest, p.sent = p.rest[n:], p.sent+n
	return n, nil
}

func run(n int, load time.Duration) {
	dir, bin, up, rp := setup()
	defer os.RemoveAll(dir)
	gw := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--upstream", up.url)
	gw.Env = append(os.Environ(), "IMGCTX_DATA_DIR="+filepath.Join(dir, "data"), "IMGCTX_LOG_LEVEL=warn", "IMGCTX_SERVER_MAX_CONCURRENT=1024")
	ic := start("imgctx", gw, listening)
	defer func() {
		for _, p := range []*proc{ic, rp, up} {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	}()

	agent, refs, growing := agentBody(ic.url)
	var streamedGrowing [][]byte
	for _, b := range growing {
		streamedGrowing = append(streamedGrowing, streamedBody(b))
	}
	var pretty bytes.Buffer
	json.Indent(&pretty, agent, "", "  ")
	same := func(direct, gw []byte) func(int) ([]byte, []byte) {
		return func(int) ([]byte, []byte) { return direct, gw }
	}
	shapes := []struct {
		name   string
		bodies func(i int) (direct, gw []byte)
	}{
		{"agent (200 messages + 6 screenshots), re-sent unchanged", same(agent, agent)},
		{"agent, history growing by one round (4 messages) a request", func(i int) ([]byte, []byte) { b := growing[i%len(growing)]; return b, b }},
		{"the same, the answer streamed (to its last event)", func(i int) ([]byte, []byte) { b := streamedGrowing[i%len(streamedGrowing)]; return b, b }},
		{"agent, screenshots by imgctx: ref", same(agent, refs)},
		{"agent, pretty-printed", same(pretty.Bytes(), pretty.Bytes())},
		{"small (1 KB text)", same(bodies.Small(), bodies.Small())},
	}
	fmt.Printf("## A/B through real processes (%d requests per row and target, loopback)\n\n", n)
	fmt.Println("| body | bytes | direct p50 | ReverseProxy adds p50 / p99 | imgctx adds p50 / p99 | ReverseProxy CPU/req | imgctx CPU/req |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, sh := range shapes {
		bases := []string{up.url, rp.url, ic.url}
		body := func(j, i int) []byte {
			direct, gw := sh.bodies(i)
			if j == 2 {
				return gw
			}
			return direct
		}
		for i := range 20 { // warm up: connections, the store, the encoding cache
			for j, base := range bases {
				if _, err := post(base, "/v1/chat/completions", body(j, i)); err != nil {
					log.Fatal(err)
				}
			}
		}
		lat := make([][]time.Duration, 3)
		cpu0 := []time.Duration{0, rp.cpu(), ic.cpu()}
		for i := range n {
			for k := range 3 {
				j := (i + k) % 3
				d, err := post(bases[j], "/v1/chat/completions", body(j, i))
				if err != nil {
					log.Fatal(err)
				}
				lat[j] = append(lat[j], d)
			}
		}
		cpu1 := []time.Duration{0, rp.cpu(), ic.cpu()}
		for _, l := range lat {
			slices.Sort(l)
		}
		q := func(l []time.Duration, f float64) time.Duration { return l[int(f*float64(len(l)-1))] }
		added := func(j int) string {
			return fmt.Sprintf("%s / %s", ms(q(lat[j], 0.5)-q(lat[0], 0.5)), ms(q(lat[j], 0.99)-q(lat[0], 0.99)))
		}
		perReq := func(j int) string { return ms((cpu1[j] - cpu0[j]) / time.Duration(n)) }
		_, gw := sh.bodies(0)
		fmt.Printf("| %s | %d | %s | %s | %s | %s | %s |\n", sh.name, len(gw), ms(q(lat[0], 0.5)), added(1), added(2), perReq(1), perReq(2))
	}
	fmt.Printf("\n## Requests/s, 1 KB text requests, %s per run\n\n", load)
	fmt.Println("| clients | conversations | direct | ReverseProxy | imgctx | imgctx / ReverseProxy |")
	fmt.Println("|---|---|---|---|---|---|")
	for _, c := range []int{16, 64} {
		// Every client re-sending one body is one conversation, whose
		// decisions imgctx takes one at a time; agents are a conversation
		// each.
		for _, own := range []bool{false, true} {
			sent, mode := slices.Repeat([][]byte{bodies.Small()}, c), "one"
			if own {
				sent, mode = ownConversations(bodies.Small(), c), "one a client"
			}
			// Short rounds, each in the other order: a VM's speed drifts
			// (here ReverseProxy's own requests/s ranged from 7,900 to
			// 13,500 over ten runs), and two rounds of half the run each
			// let the ratio move by a fifth between runs.
			var rates [3]float64
			for round := range throughputRounds {
				order := []int{0, 1, 2}
				if round%2 == 1 {
					slices.Reverse(order)
				}
				for _, j := range order {
					base := []string{up.url, rp.url, ic.url}[j]
					rates[j] += throughput(base, sent, load/throughputRounds)
				}
			}
			fmt.Printf("| %d | %s | %.0f | %.0f | %.0f | %.2f |\n", c, mode, rates[0]/throughputRounds, rates[1]/throughputRounds, rates[2]/throughputRounds, rates[2]/rates[1])
		}
	}
}

// ownConversations is body once for each of n clients, each a conversation
// of its own: the same body but for a first message naming the client.
func ownConversations(body []byte, n int) [][]byte {
	out := make([][]byte, n)
	for k := range out {
		out[k] = bytes.Replace(body, []byte(`"messages":[`), fmt.Appendf(nil, `"messages":[{"role":"user","content":"agent %d"},`, k), 1)
	}
	return out
}

var listening = regexp.MustCompile(`listening on (http://\S+)`)

// setup builds imgctx into a temporary directory and starts the scripted
// upstream and a ReverseProxy in front of it.
func setup() (dir, bin string, up, rp *proc) {
	dir, err := os.MkdirTemp("", "abmeter")
	if err != nil {
		log.Fatal(err)
	}
	self, _ := os.Executable()
	fmt.Fprintln(os.Stderr, "building imgctx…")
	bin = filepath.Join(dir, "imgctx")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/imgctx").CombinedOutput(); err != nil {
		log.Fatalf("build: %v\n%s", err, out)
	}
	up = start("upstream", exec.Command(self, "-role", "upstream"), listening)
	rp = start("ReverseProxy", exec.Command(self, "-role", "rproxy", "-target", up.url), listening)
	return dir, bin, up, rp
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }

// throughputRounds is how many rounds the requests/s of each target are
// measured in, its share of -load each.
const throughputRounds = 6

// throughput runs a client for each body for d, each sending its body,
// and returns completed requests per second.
func throughput(base string, bodies [][]byte, d time.Duration) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var done atomic.Int64
	var wg sync.WaitGroup
	for _, body := range bodies {
		wg.Go(func() {
			for ctx.Err() == nil {
				if _, err := post(base, "/v1/chat/completions", body); err == nil && ctx.Err() == nil {
					done.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return float64(done.Load()) / d.Seconds()
}

// agentBody returns the agent body with its six screenshots inline, with
// them by ref (stored in imgctx first, as a client using refs would), and
// the inline history at 41 to 50 rounds, growing.
func agentBody(imgctx string) (inline, byRef []byte, growing [][]byte) {
	var shots, refs []string
	for i := range 6 {
		png := bodies.Screenshot(uint64(i))
		resp, err := client.Post(imgctx+"/v1/images", "image/png", bytes.NewReader(png))
		if err != nil {
			log.Fatal(err)
		}
		var out struct {
			Ref string `json:"ref"`
		}
		json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		shots = append(shots, "data:image/png;base64,"+base64.StdEncoding.EncodeToString(png))
		refs = append(refs, "imgctx:"+out.Ref)
	}
	for r := 41; r <= 50; r++ {
		growing = append(growing, bodies.AgentRounds(shots, r))
	}
	return bodies.Agent(shots), bodies.Agent(refs), growing
}
