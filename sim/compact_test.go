package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/policy"
)

// The claude-code-like agent compacts as claude-code 2.1.332 does
// (scripts/agentcheck): its summary request is the history its last
// answered request sent, as sent, and the instruction after it, so it
// reads what that request cached; the request after it carries the
// summary and the step's own messages, nothing from before. By default
// (CompactAt 1) it compacts when refused: the refused request is the last
// answered one and the step's messages, and the refusal, answered so, is
// no failure. At 90% it compacts before sending the step.
func TestTheAgentSummarisesWhatItLastSent(t *testing.T) {
	prof := sonnet(t)
	prof.ContextWindow = 40_000
	for _, at := range []float64{0, 0.9} {
		var mu sync.Mutex
		var bodies [][]byte
		rep, err := Run(context.Background(), Config{Workload: smallTrace(t, 8, 5, 0), Model: prof.Name, Profile: prof, Policies: []string{"strip-on-compact"}, NoFrontier: true, CompactAt: at,
			Received: func(_ string, b []byte) {
				mu.Lock()
				bodies = append(bodies, bytes.Clone(b))
				mu.Unlock()
			}})
		if err != nil {
			t.Fatal(err)
		}
		r := row(rep, "strip-on-compact")
		refusals := 0
		if at == 0 {
			refusals = r.Compactions
		}
		if r.Compactions == 0 || r.Failed != 0 || r.Recovered != refusals {
			t.Fatalf("at %v: %d compactions, %d failed, %d refusals answered by one; want %d", at, r.Compactions, r.Failed, r.Recovered, refusals)
		}
		summaries := 0
		for i, b := range bodies {
			if !bytes.Contains(b, []byte("Summarize the conversation so far")) {
				continue
			}
			summaries++
			ask, last := messages(t, b), messages(t, bodies[i-1])
			if at == 0 {
				refused := last
				last = messages(t, bodies[i-2])
				if len(refused) <= len(last) || !reflect.DeepEqual(refused[:len(last)], last) {
					t.Fatalf("summary %d: the refused request (%d messages) is not the last answered one (%d) and the step's", summaries, len(refused), len(last))
				}
			}
			if len(ask) != len(last)+1 || !reflect.DeepEqual(ask[:len(last)], last) {
				t.Fatalf("at %v, summary %d: %d messages, not the %d its last answered request sent, as sent, and the instruction", at, summaries, len(ask), len(last))
			}
			next := messages(t, bodies[i+1])
			if len(next) > 3 || !strings.HasPrefix(fmt.Sprint(next[0].Content[0]["text"]), "Summary of the earlier conversation") {
				t.Fatalf("after summary %d: %d messages, opening %v; want the summary and the step's own", summaries, len(next), next[0].Content[0])
			}
		}
		if summaries != r.Compactions {
			t.Fatalf("at %v: %d summary requests for %d compactions", at, summaries, r.Compactions)
		}
	}
}

// message is an Anthropic message as a request carries it.
type message struct {
	Role    string
	Content []map[string]any
}

// messages reads a request's messages, breakpoints left out: a summary
// request moves the breakpoint to its end.
func messages(t *testing.T, b []byte) []message {
	t.Helper()
	var req struct{ Messages []message }
	if err := json.Unmarshal(b, &req); err != nil {
		t.Fatal(err)
	}
	for _, m := range req.Messages {
		for _, c := range m.Content {
			delete(c, "cache_control")
		}
	}
	return req.Messages
}

// A summary request the provider refuses (what the agent last sent, and
// the instruction, past the window) is asked again without its images, as
// claude-code does: no failure. On gpt-4o coding at seed 3 one of
// chunked's does.
func TestARefusedSummaryAskedAgainIsNoFailure(t *testing.T) {
	w := coding(t, 3)
	prof := gpt4o(t)
	rep, err := Run(context.Background(), Config{Workload: w, Model: prof.Name, Profile: prof, Policies: []string{"chunked-3/10"}, NoFrontier: true})
	if err != nil {
		t.Fatal(err)
	}
	if r := row(rep, "chunked-3/10"); r.Failed != 0 || r.Recovered <= r.Compactions {
		t.Fatalf("%d failed, %d refusals answered for %d compactions; want none failed and a refused summary answered", r.Failed, r.Recovered, r.Compactions)
	}
}

// proxy.client_window: imgctx refuses, as the provider would have, a
// request whose history as the agent sent it is past the window, so the
// agent compacts when it would have without imgctx and imgctx's removals
// never put its cut off. On coding at seed 2 (Sonnet, the agent
// compacting when refused) chunked newest-n dominates the default without
// it and not with it; the refusal, answered by a compaction, is no
// failure.
func TestTheClientsWindowKeepsItsCutWhereItWas(t *testing.T) {
	w := coding(t, 2)
	prof := sonnet(t)
	for _, on := range []bool{false, true} {
		rep, err := Run(context.Background(), Config{Workload: w, Model: prof.Name, Profile: prof, Policies: []string{"imgctx", "chunked-3/10"}, NoFrontier: true,
			Engine: engine.Config{Keep: policy.KeepConfig{Hold: true, Sight: policy.DefaultSight}, ProxyClientWindow: on}})
		if err != nil {
			t.Fatal(err)
		}
		ours, peer := row(rep, "imgctx"), row(rep, "chunked-3/10")
		if ours.Failed != 0 || Dominates(peer, ours) == on || on && ours.Recovered == 0 {
			t.Errorf("client window %v: %d failed, %d refusals answered; $%.2f for %.1f images against chunked's $%.2f for %.1f", on, ours.Failed, ours.Recovered, ours.Dollars, ours.ImagesMean, peer.Dollars, peer.ImagesMean)
		}
	}
}

// coding is the coding workload at a seed.
func coding(t *testing.T, seed uint64) *Workload {
	t.Helper()
	p := DefaultParams("coding")
	p.Seed = seed
	w, err := Build("coding", p)
	if err != nil {
		t.Fatal(err)
	}
	return w
}
