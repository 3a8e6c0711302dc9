package gateway

import (
	"bytes"
	"io"
	"net/http"
	"testing"

	"github.com/imgctx/imgctx/session"
)

// BenchmarkProxyRecallMarkers re-sends a conversation whose 20 earlier
// screenshots are markers, with recall off and on: what naming the
// handles costs a request (a walk of the history and the longer marker
// text; the handles are written to the store once).
func BenchmarkProxyRecallMarkers(b *testing.B) {
	for _, on := range []string{"off", "on"} {
		b.Run("recall="+on, func(b *testing.B) {
			rig := newAgentRig(b, 200_000, &session.Mem{})
			g := newAgent(b, rig, "Open the login page.")
			g.header["X-Imgctx-Recall"] = on
			g.header["X-Imgctx-Keep-Turn-Images"] = "off" // the turn's screenshots are markers at the next
			g.start()
			for range 20 {
				g.send(reply{tools: 1})
				g.results(1, false, false)
			}
			g.send(reply{})
			g.human("And now?")
			g.send(reply{})
			if (on == "on") != (len(handles(g.sent[len(g.sent)-1])) == 20) {
				b.Fatalf("recall %s: %d handles", on, len(handles(g.sent[len(g.sent)-1])))
			}
			body := g.body()
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				req, _ := http.NewRequest("POST", rig.srv.URL+"/v1/messages", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				for k, v := range g.header {
					req.Header.Set(k, v)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatal(resp.Status)
				}
			}
		})
	}
}
