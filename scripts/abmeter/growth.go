package main

import (
	"encoding/base64"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/imgctx/imgctx/internal/bodies"
)

// growth measures what each proxy adds as the history grows: agent
// histories of 50, 200, 800 and 3,200 messages with no screenshot, then
// 3,200 messages with 6, 30 and 100, each growing by one round a request
// (the last ten sizes in turn), and the 3,200-message text history re-sent
// unchanged. Its column to read is imgctx's added p50 minus
// ReverseProxy's: flat when imgctx's own work follows what is new.
func growth(n int) {
	dir, bin, up, rp := setup()
	defer os.RemoveAll(dir)
	ic := startImgctx(bin, dir, up.url)
	defer stop(ic, rp, up)
	shots := make([]string, 100)
	for i := range shots {
		shots[i] = "data:image/png;base64," + base64.StdEncoding.EncodeToString(bodies.Screenshot(uint64(100+i)))
	}
	cells := []struct{ messages, screenshots int }{{50, 0}, {200, 0}, {800, 0}, {3200, 0}, {3200, 6}, {3200, 30}, {3200, 100}}
	fmt.Printf("## Growth: each history growing by one round a request (%d requests per row and target)\n\n", n)
	fmt.Println("| messages | screenshots | bytes | direct p50 | ReverseProxy adds p50 | imgctx adds p50 | imgctx − ReverseProxy |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, c := range cells {
		rounds := (c.messages - 1) / 4
		// Screenshots go in every eighth round's tool result (bodies.AgentRounds):
		// spaced so that the wanted number fits the history.
		var grow [][]byte
		for r := rounds - 9; r <= rounds; r++ {
			grow = append(grow, bodies.AgentRounds(shots[:c.screenshots], r))
		}
		if got := strings.Count(string(grow[9]), "data:image/png"); got != c.screenshots {
			log.Printf("%d messages hold %d of the %d screenshots asked", c.messages, got, c.screenshots)
		}
		row := func(label string, lat [][]time.Duration) {
			p50 := func(j int) time.Duration { return lat[j][len(lat[j])/2] }
			fmt.Printf("| %s | %d | %d | %s | %s | %s | %s |\n", label, c.screenshots, len(grow[9]), ms(p50(0)),
				ms(p50(1)-p50(0)), ms(p50(2)-p50(0)), ms(p50(2)-p50(1)))
		}
		bases := []string{up.url, rp.url, ic.url}
		row(strconv.Itoa(c.messages), measure(bases, n, func(_, i int) []byte { return grow[i%len(grow)] }))
		if c.messages == 3200 && c.screenshots == 0 {
			// The other case: the same history re-sent unchanged.
			row("3200, re-sent", measure(bases, n, func(int, int) []byte { return grow[9] }))
		}
	}
}

// measure sends n requests of body to each base in turn (the order
// rotating), after a warm-up, and returns each base's sorted latencies.
func measure(bases []string, n int, body func(j, i int) []byte) [][]time.Duration {
	for i := range 20 {
		for j, base := range bases {
			if _, err := post(base, "/v1/chat/completions", body(j, i)); err != nil {
				log.Fatal(err)
			}
		}
	}
	lat := make([][]time.Duration, len(bases))
	for i := range n {
		for k := range bases {
			j := (i + k) % len(bases)
			d, err := post(bases[j], "/v1/chat/completions", body(j, i))
			if err != nil {
				log.Fatal(err)
			}
			lat[j] = append(lat[j], d)
		}
	}
	for _, l := range lat {
		slices.Sort(l)
	}
	return lat
}

// memory is each proxy's peak RSS under c concurrent agent bodies (2.2 MB,
// six screenshots) for d, on fresh processes: VmHWM from /proc.
func memory(c int, d time.Duration) {
	dir, bin, up, rp := setup()
	defer os.RemoveAll(dir)
	defer stop(rp, up)
	fmt.Printf("## Peak RSS, %d clients sending the agent body for %s\n\n", c, d)
	fmt.Println("| process | clients | RSS before | peak RSS |")
	fmt.Println("|---|---|---|---|")
	var ic *proc
	for i, mode := range []string{"in one conversation", "each in its own conversation"} {
		// A fresh imgctx for each, its data apart: the peak is the run's own.
		ic = startImgctx(bin, filepath.Join(dir, fmt.Sprint(i)), up.url)
		agent, _, _ := agentBody(ic.url)
		bodies := slices.Repeat([][]byte{agent}, c)
		if i > 0 {
			bodies = ownConversations(agent, c) // sixteen agents
		}
		for _, p := range []*proc{rp, ic} {
			before := p.status("VmRSS")
			p.resetPeak()
			var wg sync.WaitGroup
			deadline := time.Now().Add(d)
			for _, body := range bodies {
				wg.Go(func() {
					for time.Now().Before(deadline) {
						if _, err := post(p.url, "/v1/chat/completions", body); err != nil {
							log.Fatal(err)
						}
					}
				})
			}
			wg.Wait()
			fmt.Printf("| %s | %s (%d bytes) | %s | %s |\n", p.name, mode, len(bodies[0]), mb(before), mb(p.status("VmHWM")))
		}
		if i == 0 {
			stop(ic)
		}
	}
	defer stop(ic)
	// Idle memory goes back (imgctx's body buffers after a minute idle).
	fmt.Fprintln(os.Stderr, "idle for 70 s…")
	time.Sleep(70 * time.Second)
	fmt.Printf("\nRSS after 70 s idle: %s %s, %s %s\n", rp.name, mb(rp.status("VmRSS")), ic.name, mb(ic.status("VmRSS")))
}

// startImgctx runs imgctx serve in front of the upstream.
func startImgctx(bin, dir, upstream string) *proc {
	gw := exec.Command(bin, "serve", "--addr", "127.0.0.1:0", "--upstream", upstream)
	gw.Env = append(os.Environ(), "IMGCTX_DATA_DIR="+filepath.Join(dir, "data"), "IMGCTX_LOG_LEVEL=warn", "IMGCTX_SERVER_MAX_CONCURRENT=1024",
		"IMGCTX_SERVER_MAX_BODY_BYTES=268435456")
	return start("imgctx", gw, listening)
}

func stop(ps ...*proc) {
	for _, p := range ps {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	}
}

// status reads a field of the process's /proc status, in kB.
func (p *proc) status(field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb
		}
	}
	return 0
}

// resetPeak starts the process's peak RSS (VmHWM) again from its RSS now.
func (p *proc) resetPeak() {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.cmd.Process.Pid), []byte("5"), 0); err != nil {
		log.Printf("the peak RSS of %s is since its start: %v", p.name, err)
	}
}

func mb(kb int64) string { return fmt.Sprintf("%.0f MB", float64(kb)/1024) }
