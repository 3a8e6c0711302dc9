package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/session/sqlite"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpOverStdio runs `imgctx mcp` with args on pipes and connects the
// official SDK's client to it, as an agent launching it would.
func mcpOverStdio(t *testing.T, args ...string) (*mcp.ClientSession, <-chan result) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan result, 1)
	go func() {
		var errb bytes.Buffer
		code := run(append([]string{"mcp"}, args...), inR, outW, &errb)
		outW.Close()
		done <- result{code: code, stderr: errb.String()}
	}()
	c := mcp.NewClient(&mcp.Implementation{Name: "imgctx-test", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		inW.Close()
		r := <-done
		t.Fatalf("connect: %v (exit %d: %s)", err, r.code, r.stderr)
	}
	return cs, done
}

// imgctx mcp answers from the stores imgctx serve writes: the recalled
// image byte for byte, the conversation's list, a typed refusal for an
// unknown handle or another tenant; it exits 0 when the agent closes
// its stdin.
func TestMCPOverStdioRecallsFromTheDataDir(t *testing.T) {
	dir := t.TempDir()
	if r := imgctx(t, "store", "put", sample, "--data-dir", dir); r.code != 0 {
		t.Fatalf("store put: %d %s", r.code, r.stderr)
	}
	raw, err := os.ReadFile(sample)
	if err != nil {
		t.Fatal(err)
	}
	ref := blob.Of(raw)
	db, err := sqlite.Open(filepath.Join(dir, "imgctx.db"))
	if err != nil {
		t.Fatal(err)
	}
	h := engine.RecallHandle("conv-1", ref)
	if err := db.SaveRecalls(context.Background(), "default", []session.Recall{{Handle: h, Conversation: "conv-1", Ref: ref,
		MediaType: "image/png", Caption: "the login form", Reason: "budget", Model: "claude-sonnet-4-6", Removed: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	cs, done := mcpOverStdio(t, "--data-dir", dir)
	ctx := context.Background()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: chat.RecallTool, Arguments: map[string]any{"handle": h}})
	if err != nil || res.IsError {
		t.Fatalf("recall: %v %+v", err, res)
	}
	var img *mcp.ImageContent
	var text string
	for _, c := range res.Content {
		switch c := c.(type) {
		case *mcp.ImageContent:
			img = c
		case *mcp.TextContent:
			text += c.Text
		}
	}
	if img == nil || img.MIMEType != "image/png" || !bytes.Equal(img.Data, raw) || !strings.Contains(text, "the login form") {
		t.Fatalf("recalled %v, %q", img != nil && bytes.Equal(img.Data, raw), text)
	}
	list, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "imgctx_list", Arguments: map[string]any{"handle": h}})
	if err != nil || list.IsError || !strings.Contains(list.Content[0].(*mcp.TextContent).Text, h+"  ") {
		t.Fatalf("list: %v %+v", err, list)
	}
	bad, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: chat.RecallTool, Arguments: map[string]any{"handle": "iaaaaaaaaaaa"}})
	if err != nil || !bad.IsError {
		t.Fatalf("an unknown handle: %v %+v", err, bad)
	}
	cs.Close()
	if r := <-done; r.code != 0 {
		t.Fatalf("mcp exited %d when its stdin closed: %s", r.code, r.stderr)
	}

	other, done := mcpOverStdio(t, "--data-dir", dir, "--tenant", "beta")
	if res, err := other.CallTool(ctx, &mcp.CallToolParams{Name: chat.RecallTool, Arguments: map[string]any{"handle": h}}); err != nil || !res.IsError {
		t.Fatalf("another tenant recalled the image: %v %+v", err, res)
	}
	other.Close()
	<-done

	if r := imgctx(t, "mcp", "--data-dir", filepath.Join(dir, "missing")); r.code != 1 || !strings.Contains(r.stderr, "check --data-dir") {
		t.Fatalf("a missing data directory: exit %d, %q", r.code, r.stderr)
	}
	if r := imgctx(t, "mcp", "--data-dir", dir, "--tenant", "../x"); r.code != 2 {
		t.Fatalf("a bad tenant: exit %d, %q", r.code, r.stderr)
	}
}
