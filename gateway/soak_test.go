package gateway

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/prometheus/client_golang/prometheus"
)

var soakFor = flag.Duration("soak", 0, "run TestSoak for this long, e.g. -soak 10m")

// TestSoak sends a steady mix of requests through the gateway — text, new
// inline images, the same images re-sent, images by ref, whole session
// lives (create, turns with an image, read, delete) — and fails if the
// live heap or the goroutine count keeps growing once warm. Off by default,
// since it runs as long as it is told:
//
//	go test ./gateway -run TestSoak -soak 10m -v
func TestSoak(t *testing.T) {
	if *soakFor <= 0 {
		t.Skip("a soak run: go test ./gateway -run TestSoak -soak 10m -v")
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, completion)
	}))
	defer up.Close()
	// Images on disk, so the heap measures the gateway, not the store.
	fs, err := imagestore.NewFS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// A small encoding cache, full within seconds: its bound, not its
	// default size, is what a long run should show.
	e := &engine.Engine{Images: imagestore.Verified{Store: fs}, Sessions: &session.Mem{}, Profiles: tokens.Default(),
		Upstream: &upstream.Client{Format: upstream.OpenAI, BaseURL: up.URL, MaxRetries: -1},
		Config:   engine.Config{Base64CacheBytes: 8 << 20}}
	keys := map[string]string{"main": "default", "fresh": "fresh"} // new images go to their own tenant
	srv := httptest.NewServer(New(Config{Keys: keys, MaxBodyBytes: 64 << 20}, e, prometheus.NewRegistry(), discardLogger()).Handler())
	defer srv.Close()

	// Every freshKinds cycles the fresh tenant's images are deleted, so each
	// image it sends is new to the store again: the store, the caches and the
	// disk see a bounded set, and any growth left is a leak.
	const freshKinds = 500
	shots := screenshots(4, 96)
	dataURL := func(b []byte) string { return "data:image/png;base64," + base64.StdEncoding.EncodeToString(b) }
	var refs []string
	for _, s := range shots[2:] {
		ref := blob.Of(s)
		if err := fs.Put(t.Context(), "default", ref, s); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, "imgctx:"+ref.String())
	}
	resent := imageRequest([]string{dataURL(shots[0]), dataURL(shots[1])})
	byRef := imageRequest(refs)
	text := textRequest()

	client := &http.Client{}
	send := func(method, path, key string, body []byte) []byte {
		req, _ := http.NewRequest(method, srv.URL+path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if resp.StatusCode >= 300 {
			t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, out)
		}
		return out
	}
	cycle := func(i int) {
		send("POST", "/v1/chat/completions", "main", text)
		send("POST", "/v1/chat/completions", "main", resent)
		send("POST", "/v1/chat/completions", "main", byRef)
		fresh := distinctPNG(shots[0], i%freshKinds) // new since the last drop
		send("POST", "/v1/chat/completions", "fresh", imageRequest([]string{dataURL(fresh)}))
		var s struct{ ID string }
		json.Unmarshal(send("POST", "/v1/sessions", "main", []byte(`{"model":"gpt-4o","keep_turn_images":true}`)), &s)
		for range 3 {
			send("POST", "/v1/sessions/"+s.ID+"/turn", "main", fmt.Appendf(nil,
				`{"messages":[{"role":"user","content":[{"type":"text","text":"and now?"},{"type":"image_url","image_url":{"url":%q}}]}]}`, dataURL(shots[1])))
		}
		send("GET", "/v1/sessions/"+s.ID, "main", nil)
		send("DELETE", "/v1/sessions/"+s.ID, "main", nil)
	}
	dropFresh := func() {
		var gone []blob.Ref
		fs.List(t.Context(), "fresh", func(in imagestore.Info) error { gone = append(gone, in.Ref); return nil })
		for _, ref := range gone {
			fs.Delete(t.Context(), "fresh", ref)
		}
	}

	type sample struct {
		cycles     int
		heap       float64 // bytes live after a full collection, and body buffers in use outside it
		goroutines int
	}
	const samples = 20
	var got []sample
	start, cycles := time.Now(), 0
	for k := 1; k <= samples; k++ {
		for time.Since(start) < *soakFor*time.Duration(k)/samples {
			if cycles%freshKinds == 0 {
				dropFresh()
			}
			cycle(cycles)
			cycles++
		}
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		s := sample{cycles, float64(m.HeapAlloc) + float64(inUse(bodyBuffers)), runtime.NumGoroutine()}
		got = append(got, s)
		t.Logf("%6s  %6d cycles  heap %6.1f MB  %3d goroutines", time.Since(start).Round(time.Second), cycles, s.heap/1e6, s.goroutines)
	}
	// Warm after a quarter of the run. Growth is the heap kept per cycle
	// between the first warm samples and the last ones (medians of three,
	// against the noise of a collection): a leak of one small object per
	// request shows, a cache settling at its bound does not.
	median := func(ss []sample) sample {
		ss = slices.Clone(ss)
		slices.SortFunc(ss, func(a, b sample) int { return cmp.Compare(a.heap, b.heap) })
		return ss[len(ss)/2]
	}
	first, last := median(got[samples/4:samples/4+3]), median(got[samples-3:])
	perCycle := (last.heap - first.heap) / float64(max(1, last.cycles-first.cycles))
	t.Logf("%d cycles (%d requests); warm heap %.1f MB → %.1f MB (%+.0f bytes a cycle), goroutines %d → %d",
		cycles, cycles*10, first.heap/1e6, last.heap/1e6, perCycle, got[samples/4].goroutines, got[samples-1].goroutines)
	if perCycle > 64 {
		t.Errorf("the heap kept %.0f bytes a cycle (%.1f MB → %.1f MB)", perCycle, first.heap/1e6, last.heap/1e6)
	}
	if got[samples-1].goroutines > got[samples/4].goroutines+8 {
		t.Errorf("goroutines grew from %d to %d over the run", got[samples/4].goroutines, got[samples-1].goroutines)
	}
}
