package main

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"log"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/imgctx/imgctx/internal/bodies"
)

// soak runs c clients against each proxy at once for d, each client going
// through conversations of its own the way agents do: the history growing
// by a round a request (10 to 60 rounds, a screenshot every eighth round),
// then a new conversation. Screenshots come from a pool of 256, so
// conversations share some and bring others, and the store, the span
// cache and the resume cache all turn over. It prints each process's RSS
// every tenth of d and exits 1 when imgctx's grows: when its RSS at the
// end passes by more than a tenth its largest between a fifth and half of
// the run (warm by then). With idle, it then waits that long and prints
// the RSS once more.
func soak(c int, d, idle time.Duration) (grew bool) {
	dir, bin, up, rp := setup()
	defer os.RemoveAll(dir)
	ic := startImgctx(bin, dir, up.url)
	defer stop(ic, rp, up)
	fmt.Fprintln(os.Stderr, "drawing 256 screenshots…")
	pool := make([]string, 256)
	for i := range pool {
		pool[i] = "data:image/png;base64," + base64.StdEncoding.EncodeToString(bodies.Screenshot(uint64(1000+i)))
	}
	fmt.Printf("## Soak: %d clients a proxy for %s, growing conversations with screenshots\n\n", c, d)
	fmt.Println("| elapsed | imgctx RSS | imgctx requests | ReverseProxy RSS | ReverseProxy requests |")
	fmt.Println("|---|---|---|---|---|")
	deadline := time.Now().Add(d)
	var counts [2]atomic.Int64
	var wg sync.WaitGroup
	for j, p := range []*proc{ic, rp} {
		for k := range c {
			wg.Go(func() {
				for g := 0; time.Now().Before(deadline); g++ {
					shots := make([]string, 8)
					for i := range shots {
						shots[i] = pool[(k*37+g*11+i*5)%len(pool)]
					}
					opening := fmt.Appendf(nil, `"messages":[{"role":"user","content":"soak conversation %d-%d"},`, k, g)
					for r := 10; r <= 60 && time.Now().Before(deadline); r++ {
						body := bytes.Replace(bodies.AgentRounds(shots, r), []byte(`"messages":[`), opening, 1)
						if _, err := post(p.url, "/v1/chat/completions", body); err != nil {
							log.Fatal(err)
						}
						counts[j].Add(1)
					}
				}
			})
		}
	}
	tick := d / 10
	var samples []int64
	for i := 1; i <= 10; i++ {
		time.Sleep(time.Until(deadline.Add(-d + time.Duration(i)*tick)))
		samples = append(samples, ic.status("VmRSS"))
		fmt.Printf("| %s | %s | %d | %s | %d |\n", (time.Duration(i) * tick).Round(time.Second), mb(samples[len(samples)-1]),
			counts[0].Load(), mb(rp.status("VmRSS")), counts[1].Load())
	}
	wg.Wait()
	warm := max(samples[1], samples[2], samples[3], samples[4])
	last := samples[len(samples)-1]
	fmt.Printf("\nimgctx peak RSS %s; warm (a fifth to half of the run) at most %s; at the end %s\n", mb(ic.status("VmHWM")), mb(warm), mb(last))
	if idle > 0 {
		// What a gateway whose traffic stops gives back: the body buffers
		// idle past a minute, the conversations' held requests past five.
		fmt.Fprintf(os.Stderr, "idle for %s…\n", idle)
		time.Sleep(idle)
		fmt.Printf("after %s idle: imgctx RSS %s, ReverseProxy %s\n", idle, mb(ic.status("VmRSS")), mb(rp.status("VmRSS")))
	}
	if float64(last) > 1.1*float64(warm) {
		fmt.Println("imgctx's RSS grew over the run")
		return true
	}
	return false
}
