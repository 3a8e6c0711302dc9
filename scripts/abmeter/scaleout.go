package main

import (
	"context"
	"fmt"
	"log"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/imgctx/imgctx/internal/bodies"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// scaleout measures the proxy path on its two storage set-ups in one run:
// one imgctx on SQLite + a directory, one on PostgreSQL + S3, and two on
// PostgreSQL + S3 taking requests in turn, beside httputil.ReverseProxy.
// The servers come from scripts/testservices (IMGCTXTEST_POSTGRES,
// IMGCTXTEST_S3).
func scaleout(n int, load time.Duration) {
	dsn, s3env := os.Getenv("IMGCTXTEST_POSTGRES"), os.Getenv("IMGCTXTEST_S3")
	if dsn == "" || s3env == "" {
		log.Fatal(`-scaleout needs PostgreSQL and S3: eval "$(scripts/testservices start)" first`)
	}
	f := strings.SplitN(s3env, ",", 3)
	bucket := makeBucket(f[0], f[1], f[2])
	dir, bin, up, rp := setup()
	defer os.RemoveAll(dir)
	gateway := func(name string, env ...string) *proc {
		cmd := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--upstream", up.url)
		cmd.Env = append(os.Environ(), append(env, "IMGCTX_DATA_DIR="+filepath.Join(dir, name), "IMGCTX_LOG_LEVEL=warn", "IMGCTX_SERVER_MAX_CONCURRENT=1024")...)
		return start(name, cmd, listening)
	}
	shared := []string{"IMGCTX_STORAGE_SESSIONS=postgres", "IMGCTX_STORAGE_POSTGRES_DSN=" + dsn,
		"IMGCTX_STORAGE_IMAGES=s3", "IMGCTX_STORAGE_S3_ENDPOINT=" + f[0], "IMGCTX_STORAGE_S3_BUCKET=" + bucket,
		"IMGCTX_STORAGE_S3_ACCESS_KEY=" + f[1], "IMGCTX_STORAGE_S3_SECRET_KEY=" + f[2]}
	local := gateway("local")
	pg1, pg2 := gateway("pg1", shared...), gateway("pg2", shared...)
	defer func() {
		for _, p := range []*proc{local, pg1, pg2, rp, up} {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	}()

	// A target is one or more processes taking requests in turn.
	type target struct {
		name  string
		procs []*proc
		next  atomic.Int64
	}
	targets := []*target{{name: "direct", procs: []*proc{up}}, {name: "ReverseProxy", procs: []*proc{rp}},
		{name: "imgctx, SQLite + directory", procs: []*proc{local}}, {name: "imgctx, PostgreSQL + S3", procs: []*proc{pg1}},
		{name: "imgctx ×2, PostgreSQL + S3", procs: []*proc{pg1, pg2}}}
	base := func(t *target) string { return t.procs[int(t.next.Add(1))%len(t.procs)].url }

	_, _, growing := agentBody(local.url)
	fmt.Printf("## Scale-out: the proxy path on each storage set-up (%d requests per target, loopback)\n\n", n)
	fmt.Println("Body: the agent history growing by one round a request (41 to 50 rounds, 6 inline screenshots, ≈2.2 MB),")
	fmt.Println("one conversation, so every request reads and writes its decisions.")
	fmt.Println()
	fmt.Println("| target | p50 | p99 | adds p50 over direct |")
	fmt.Println("|---|---|---|---|")
	lat := make([][]time.Duration, len(targets))
	for i := range 20 + n {
		for k := range targets {
			j := (i + k) % len(targets)
			d, err := post(base(targets[j]), "/v1/chat/completions", growing[i%len(growing)])
			if err != nil {
				log.Fatal(err)
			}
			if i >= 20 { // the first 20 warm connections and stores
				lat[j] = append(lat[j], d)
			}
		}
	}
	q := func(l []time.Duration, f float64) time.Duration { return l[int(f*float64(len(l)-1))] }
	for j, t := range targets {
		slices.Sort(lat[j])
		fmt.Printf("| %s | %s | %s | %s |\n", t.name, ms(q(lat[j], 0.5)), ms(q(lat[j], 0.99)), ms(q(lat[j], 0.5)-q(lat[0], 0.5)))
	}

	fmt.Printf("\n## Scale-out: requests/s and latency under load, 1 KB text requests, 16 clients, %s per run\n\n", load)
	fmt.Println("| target | requests/s | p50 | p99 |")
	fmt.Println("|---|---|---|---|")
	for _, t := range targets {
		rate, p50, p99 := loaded(func() string { return base(t) }, bodies.Small(), 16, load)
		fmt.Printf("| %s | %.0f | %s | %s |\n", t.name, rate, ms(p50), ms(p99))
	}
}

// loaded runs c clients for d against the bases pick names and returns the
// completed requests per second with their p50 and p99.
func loaded(pick func() string, body []byte, c int, d time.Duration) (float64, time.Duration, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	var all []time.Duration
	var wg sync.WaitGroup
	for range c {
		wg.Go(func() {
			var mine []time.Duration
			for ctx.Err() == nil {
				if l, err := post(pick(), "/v1/chat/completions", body); err == nil && ctx.Err() == nil {
					mine = append(mine, l)
				}
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(all) == 0 {
		return 0, 0, 0
	}
	slices.Sort(all)
	return float64(len(all)) / d.Seconds(), all[len(all)/2], all[len(all)*99/100]
}

func makeBucket(endpoint, access, secret string) string {
	u, err := url.Parse(endpoint)
	if err != nil {
		log.Fatal(err)
	}
	c, err := minio.New(u.Host, &minio.Options{Creds: credentials.NewStaticV4(access, secret, ""), Secure: u.Scheme == "https"})
	if err != nil {
		log.Fatal(err)
	}
	name := fmt.Sprintf("abmeter-%d", time.Now().UnixNano())
	if err := c.MakeBucket(context.Background(), name, minio.MakeBucketOptions{}); err != nil {
		log.Fatalf("make bucket: %v", err)
	}
	return name
}
