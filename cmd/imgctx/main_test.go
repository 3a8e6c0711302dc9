package main

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/session/sqlite"
)

const sample = "../../testdata/screenshot.png"

type result struct {
	code           int
	stdout, stderr string
}

func imgctx(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(args, strings.NewReader(""), &out, &errb)
	return result{code, out.String(), errb.String()}
}

func TestEstimateSample(t *testing.T) {
	r := imgctx(t, "estimate", sample)
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"image/png", "1280×800", "sha256-", "gpt-4o", "1105", "claude-opus-4-7", "qwen3-vl"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestEstimateJSONForOneModel(t *testing.T) {
	r := imgctx(t, "estimate", sample, "--model", "claude-sonnet-4-6", "--json")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var got []estimateResult
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	// 1280×800 on the standard tier: ceil(1280/28)·ceil(800/28) = 46·29.
	if len(got) != 1 || len(got[0].Estimates) != 1 || got[0].Estimates[0].Tokens != 1334 || got[0].Width != 1280 {
		t.Fatalf("got %+v", got)
	}
}

func TestEstimateUnknownModelWarns(t *testing.T) {
	r := imgctx(t, "estimate", sample, "--model", "mystery-vlm")
	if r.code != 0 || !strings.Contains(r.stderr, "unknown model") || !strings.Contains(r.stdout, "default") {
		t.Fatalf("exit %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
}

func writeTemp(t *testing.T, name string, data []byte) string {
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// badInputs are the refusals the foundation issue names, as files.
func badInputs(t *testing.T) map[string]string {
	ihdr := make([]byte, 17)
	copy(ihdr, "IHDR")
	binary.BigEndian.PutUint32(ihdr[4:], 100000)
	binary.BigEndian.PutUint32(ihdr[8:], 100000)
	ihdr[12], ihdr[13] = 8, 6
	bomb := append([]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0d"), ihdr...)
	bomb = binary.BigEndian.AppendUint32(bomb, crc32.ChecksumIEEE(ihdr))
	png, _ := os.ReadFile(sample)
	return map[string]string{
		"text named .png":       writeTemp(t, "notes.png", []byte("this is not an image\n")),
		"0-byte file":           writeTemp(t, "empty.png", nil),
		"100000x100000 png":     writeTemp(t, "bomb.png", bomb),
		"gif bomb":              writeTemp(t, "bomb.gif", []byte("GIF89a\xff\xff\xff\xff\x00\x00\x00\x2C\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02\x44\x01\x00\x3B")),
		"truncated png":         writeTemp(t, "cut.png", png[:40]),
		"missing file":          filepath.Join(t.TempDir(), "nope.png"),
		"over the byte default": writeTemp(t, "huge.png", append(bytes.Clone(png), make([]byte, 11<<20)...)),
	}
}

func TestBadInputIsRefusedAndNothingStored(t *testing.T) {
	dir := t.TempDir()
	for name, path := range badInputs(t) {
		t.Run(name, func(t *testing.T) {
			// Refusals go to standard error, as store's do (issue "Hardening", item 16).
			r := imgctx(t, "estimate", path)
			if r.code != 1 || !strings.Contains(r.stderr, "refused") || strings.Contains(r.stdout, "refused") {
				t.Fatalf("estimate: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
			}
			r = imgctx(t, "store", "put", path, "--data-dir", dir)
			if r.code != 1 || !strings.Contains(r.stderr, "refused") {
				t.Fatalf("store put: exit %d\n%s", r.code, r.stderr)
			}
		})
	}
	r := imgctx(t, "store", "verify", "--data-dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "verified 0 image(s)") {
		t.Fatalf("refused input left something in the store: %s %s", r.stdout, r.stderr)
	}
}

func TestStoreRoundTrip(t *testing.T) {
	dir := t.TempDir()
	r := imgctx(t, "store", "put", sample, sample, "--data-dir", dir)
	if r.code != 0 {
		t.Fatalf("put: %d %s", r.code, r.stderr)
	}
	ref := strings.Fields(r.stdout)[0]
	out := filepath.Join(t.TempDir(), "back.png")
	if r := imgctx(t, "store", "get", ref, "-o", out, "--data-dir", dir); r.code != 0 {
		t.Fatalf("get: %d %s", r.code, r.stderr)
	}
	want, _ := os.ReadFile(sample)
	if got, _ := os.ReadFile(out); !bytes.Equal(got, want) {
		t.Fatal("get returned different bytes")
	}
	r = imgctx(t, "store", "stat", ref, "--json", "--data-dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, `"bytes":5908`) {
		t.Fatalf("stat: %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = imgctx(t, "store", "verify", "--data-dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "verified 1 image(s)") {
		t.Fatalf("two puts of one image must store it once: %s", r.stdout)
	}
	// Another tenant does not see it.
	if r := imgctx(t, "store", "stat", ref, "--tenant", "other", "--data-dir", dir); r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Fatalf("other tenant: %d %s", r.code, r.stderr)
	}
	// gc keeps recent images, then removes them when told to.
	if r := imgctx(t, "store", "gc", "--data-dir", dir); r.code != 0 || !strings.Contains(r.stdout, "removed 0 of 1") {
		t.Fatalf("gc: %s %s", r.stdout, r.stderr)
	}
	if r := imgctx(t, "store", "gc", "--older-than", "1ns", "--data-dir", dir); r.code != 0 || !strings.Contains(r.stdout, "removed 1 of 1") {
		t.Fatalf("gc all: %s %s", r.stdout, r.stderr)
	}
}

func TestStoreVerifyFindsCorruption(t *testing.T) {
	dir := t.TempDir()
	r := imgctx(t, "store", "put", sample, "--data-dir", dir)
	ref := strings.TrimPrefix(strings.Fields(r.stdout)[0], "sha256-")
	path := filepath.Join(dir, "images", "default", ref[:2], ref[2:])
	b, _ := os.ReadFile(path)
	b[len(b)-3] ^= 0xff
	os.WriteFile(path, b, 0o600)
	r = imgctx(t, "store", "verify", "--data-dir", dir)
	if r.code != 1 || !strings.Contains(r.stdout, "corrupt  sha256-"+ref) || !strings.Contains(r.stderr, "hint") {
		t.Fatalf("verify: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r := imgctx(t, "store", "get", "sha256-"+ref, "-o", filepath.Join(dir, "x"), "--data-dir", dir); r.code != 1 {
		t.Fatalf("get of a corrupt blob: exit %d", r.code)
	}
}

func TestStoreEncrypted(t *testing.T) {
	dir := t.TempDir()
	key := writeTemp(t, "master.key", []byte(strings.Repeat("ab", 32)+"\n"))
	r := imgctx(t, "store", "put", sample, "--data-dir", dir, "--encrypt-key-file", key)
	if r.code != 0 {
		t.Fatalf("put: %s", r.stderr)
	}
	ref := strings.Fields(r.stdout)[0]
	out := filepath.Join(t.TempDir(), "back.png")
	if r := imgctx(t, "store", "get", ref, "-o", out, "--data-dir", dir, "--encrypt-key-file", key); r.code != 0 {
		t.Fatalf("get with key: %s", r.stderr)
	}
	if r := imgctx(t, "store", "get", ref, "-o", out, "--data-dir", dir); r.code != 1 {
		t.Fatal("sealed blob read without the key")
	}
	// Regression (issue "Hardening", item 13): read without its key, every
	// sealed blob was "corrupt" and the hint said to put it again — which
	// would store it in plaintext. Verify says sealed, goes on, and says why.
	r = imgctx(t, "store", "verify", "--data-dir", dir)
	if r.code != 1 || !strings.Contains(r.stdout, "sealed   "+ref) || strings.Contains(r.stdout, "corrupt  ") ||
		!strings.Contains(r.stdout, "0 corrupt, 1 sealed") || !strings.Contains(r.stderr, "--encrypt-key-file") || strings.Contains(r.stderr, "put the image again") {
		t.Fatalf("verify without the key: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	if r = imgctx(t, "store", "verify", "--data-dir", dir, "--encrypt-key-file", key); r.code != 0 || !strings.Contains(r.stdout, "0 corrupt, 0 sealed") {
		t.Fatalf("verify with the key: %d %s %s", r.code, r.stdout, r.stderr)
	}
	loose := writeTemp(t, "loose.key", []byte(strings.Repeat("ab", 32)))
	os.Chmod(loose, 0o644)
	if r := imgctx(t, "store", "put", sample, "--data-dir", dir, "--encrypt-key-file", loose); r.code != 1 || !strings.Contains(r.stderr, "chmod 600") {
		t.Fatalf("world-readable key: %d %s", r.code, r.stderr)
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	for _, args := range [][]string{
		{"estimate"},
		{"frobnicate"},
		{"estimate", sample, "--no-such-flag"},
		{"store", "get", "sha256-nothex"},
		{"store", "stat"},
		{"store", "gc", "--older-than", "-1h"},
		{"store", "bogus"},
	} {
		r := imgctx(t, args...)
		if r.code != 2 || !strings.Contains(r.stderr, "imgctx:") || !strings.Contains(r.stderr, "hint:") {
			t.Errorf("%v: exit %d, stderr %q; want 2 with a hint", args, r.code, r.stderr)
		}
	}
}

func TestProfilesAndVersion(t *testing.T) {
	r := imgctx(t, "profiles")
	if r.code != 0 || !strings.Contains(r.stdout, "claude-high-resolution") || !strings.Contains(r.stdout, "(any other model)") {
		t.Fatalf("profiles: %s", r.stdout)
	}
	r = imgctx(t, "profiles", "--json")
	var got struct {
		Profiles []struct{ Name string }
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &got) != nil || len(got.Profiles) < 20 {
		t.Fatalf("profiles --json: %d profiles", len(got.Profiles))
	}
	if r := imgctx(t, "version"); r.code != 0 || !strings.HasPrefix(r.stdout, "imgctx ") {
		t.Fatalf("version: %q", r.stdout)
	}
}

func TestConfigFileIsUsed(t *testing.T) {
	cfg := writeTemp(t, "imgctx.yaml", []byte("media:\n  max_image_bytes: 1000\n"))
	r := imgctx(t, "estimate", sample, "--config", cfg)
	if r.code != 1 || !strings.Contains(r.stderr, "over the limit of 1000 bytes") {
		t.Fatalf("config not applied: %d %s", r.code, r.stderr)
	}
	bad := writeTemp(t, "bad.yaml", []byte("media:\n  max_bytes_typo: 1\n"))
	if r := imgctx(t, "estimate", sample, "--config", bad); r.code != 1 || !strings.Contains(r.stderr, "unknown key") {
		t.Fatalf("bad config: %d %s", r.code, r.stderr)
	}
}

func TestServeHelpSufficesToStart(t *testing.T) {
	r := imgctx(t, "serve", "--help")
	for _, want := range []string{"--upstream", "--upstream-format", "--addr", "IMGCTX_UPSTREAM_BASE_URL", "docs/config.md", "Example"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("serve --help lacks %q", want)
		}
	}
	if r.code != 0 {
		t.Fatalf("exit %d", r.code)
	}
}

// Regression (issue "Hardening", item 16): a missing file printed
// "refused ():" with an empty reason, and --detail ultra was accepted
// silently for most models.
func TestEstimateNamesEveryRefusal(t *testing.T) {
	r := imgctx(t, "estimate", "no-such-file.png")
	if r.code != 1 || !strings.Contains(r.stderr, "refused (unreadable)") {
		t.Fatalf("missing file: %d %q", r.code, r.stderr)
	}
	r = imgctx(t, "estimate", sample, "--detail", "ultra")
	if r.code != 2 || !strings.Contains(r.stderr, `--detail "ultra" is not a detail level`) {
		t.Fatalf("--detail ultra: %d %q", r.code, r.stderr)
	}
	if r = imgctx(t, "estimate", sample, "--detail", "low"); r.code != 0 {
		t.Fatalf("--detail low: %d %q", r.code, r.stderr)
	}
}

// Regression (issue "Hardening", item 15): a bad value on the command line
// exited 1; it is a usage error.
func TestBadFlagValuesExitTwo(t *testing.T) {
	for _, args := range [][]string{{"estimate", sample, "--log-level", "loud"}, {"serve", "--upstream-format", "grpc"}, {"serve", "--addr", "nonsense"}} {
		if r := imgctx(t, args...); r.code != 2 {
			t.Errorf("%v: exit %d (%s); want 2", args, r.code, r.stderr)
		}
	}
}

// Regression (issue "Hardening", item 14): `store gc --older-than 1s`
// deleted images that live sessions still referenced (the next request by
// that ref got 404). GC keeps them and says so.
func TestGCKeepsImagesSessionsUse(t *testing.T) {
	dir := t.TempDir()
	other := writeTemp(t, "other.png", distinct(t, 1))
	r := imgctx(t, "store", "put", sample, other, "--data-dir", dir)
	if r.code != 0 {
		t.Fatalf("put: %d %s", r.code, r.stderr)
	}
	used, err := blob.Parse(strings.Fields(r.stdout)[0])
	if err != nil {
		t.Fatalf("ref from %q: %v", r.stdout, err)
	}
	db, err := sqlite.Open(filepath.Join(dir, "imgctx.db"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := db.Create(t.Context(), session.Meta{Tenant: "default", Thread: chat.Main})
	if err == nil {
		_, err = db.Append(t.Context(), "default", m.ID, nil, session.State{Live: []chat.Message{{Role: chat.User,
			Parts: []chat.Part{chat.Image{Ref: used, MediaType: "image/png"}}}}})
	}
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	r = imgctx(t, "store", "gc", "--older-than", "1ns", "--data-dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "removed 1 of 2 image(s)") || !strings.Contains(r.stdout, "kept 1 still used by a session") {
		t.Fatalf("gc: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r = imgctx(t, "store", "stat", used.String(), "--data-dir", dir); r.code != 0 {
		t.Fatalf("the session's image is gone: %s", r.stderr)
	}
}

// distinct is the sample PNG with a text chunk naming n before its IEND.
func distinct(t *testing.T, n int) []byte {
	png, err := os.ReadFile(sample)
	if err != nil {
		t.Fatal(err)
	}
	iend := bytes.LastIndex(png, []byte("IEND")) - 4
	body := append([]byte("tEXtn\x00"), fmt.Sprint(n)...)
	chunk := binary.BigEndian.AppendUint32(nil, uint32(len(body)-4))
	chunk = append(append(chunk, body...), binary.BigEndian.AppendUint32(nil, crc32.ChecksumIEEE(body))...)
	return append(append(append([]byte(nil), png[:iend]...), chunk...), png[iend:]...)
}

// Regression (issue "Hardening", item 15): a mistyped --data-dir was
// created silently by store verify and stat.
func TestMistypedDataDirIsNotCreated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "imgctx-dat")
	for _, args := range [][]string{{"store", "verify"}, {"store", "stat", "sha256-534742a9a0be702e61ca5937b744994707ab2944ffb315b35a959ef1f5173e57"}, {"store", "gc"}} {
		r := imgctx(t, append(args, "--data-dir", dir)...)
		if r.code != 1 || !strings.Contains(r.stderr, "check --data-dir") {
			t.Errorf("%v: %d %s", args, r.code, r.stderr)
		}
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatal("the mistyped data directory was created")
	}
}

// migrate says what it applied, and that there was nothing to apply on the
// next run; a missing data directory is named as such.
func TestMigrateSaysWhatItApplied(t *testing.T) {
	dir := t.TempDir()
	if r := imgctx(t, "migrate", "--data-dir", dir); r.code != 0 || !strings.Contains(r.stdout, "applied migrations 1, 2, 3, 4, 5, 6, 7 to the sqlite session store") {
		t.Fatalf("first run: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	if r := imgctx(t, "migrate", "--data-dir", dir); r.code != 0 || !strings.Contains(r.stdout, "up to date (nothing to apply)") {
		t.Fatalf("second run: exit %d, %q", r.code, r.stdout)
	}
	missing := filepath.Join(dir, "no", "such")
	if r := imgctx(t, "migrate", "--data-dir", missing); r.code == 0 || !strings.Contains(r.stderr, "does not exist") {
		t.Fatalf("missing data directory: exit %d, %q", r.code, r.stderr)
	}
}

// An image given as a data URL or bare base64 text (an agent's log) is
// priced from its header alone, like the file it encodes; text that is not
// an image is refused with its reason.
func TestEstimateBase64Text(t *testing.T) {
	data, err := os.ReadFile(sample)
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.StdEncoding.EncodeToString(data)
	var want []estimateResult
	if r := imgctx(t, "estimate", sample, "--json"); json.Unmarshal([]byte(r.stdout), &want) != nil {
		t.Fatalf("estimate of the file: %s", r.stdout)
	}
	for name, text := range map[string]string{"data URL": "data:image/png;base64," + b64 + "\n", "bare": b64} {
		r := imgctx(t, "estimate", writeTemp(t, "shot.txt", []byte(text)), "--json")
		var got []estimateResult
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &got) != nil {
			t.Fatalf("%s: exit %d: %s %s", name, r.code, r.stdout, r.stderr)
		}
		g, w := got[0], want[0]
		if g.MediaType != w.MediaType || g.Width != w.Width || g.Height != w.Height || g.Ref != "" || !strings.Contains(g.Note, "base64 header") {
			t.Fatalf("%s: %+v; the file gave %+v", name, g, w)
		}
		for i := range g.Estimates {
			if g.Estimates[i].Tokens != w.Estimates[i].Tokens {
				t.Fatalf("%s: %s priced %d; the file %d", name, g.Estimates[i].Model, g.Estimates[i].Tokens, w.Estimates[i].Tokens)
			}
		}
	}
	r := imgctx(t, "estimate", writeTemp(t, "text.txt", []byte(base64.StdEncoding.EncodeToString([]byte("just some text, not an image at all")))))
	if r.code != 1 || !strings.Contains(r.stderr, "refused (invalid)") {
		t.Fatalf("base64 of text: exit %d: %s", r.code, r.stderr)
	}
}

// Issue "Hardening, third pass", item 6: while a proxied conversation is
// live, `store gc` deletes nothing it could still be re-sending: an image
// younger than proxy.idle_expiry (plus the touch interval) stays whatever
// --older-than says, and gc says why. Once none is live, --older-than
// holds again.
func TestGCKeepsImagesOfLiveProxiedConversations(t *testing.T) {
	dir := t.TempDir()
	if r := imgctx(t, "store", "put", sample, "--data-dir", dir); r.code != 0 {
		t.Fatalf("put: %d %s", r.code, r.stderr)
	}
	db, err := sqlite.Open(filepath.Join(dir, "imgctx.db"))
	if err != nil {
		t.Fatal(err)
	}
	err = db.SaveProxied(t.Context(), "default", strings.Repeat("a", 64), session.Proxied{TurnAt: -1, LastActivity: time.Now()})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	r := imgctx(t, "store", "gc", "--older-than", "1ns", "--data-dir", dir)
	if r.code != 0 || !strings.Contains(r.stdout, "removed 0 of 1 image(s)") || !strings.Contains(r.stderr, "1 proxied conversation(s) are live") {
		t.Fatalf("gc with a live proxied conversation: %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = imgctx(t, "store", "gc", "--older-than", "1ns", "--data-dir", dir, "--config", writeTemp(t, "c.yaml", []byte("proxy:\n  idle_expiry: 1ns\n")))
	if r.code != 0 || !strings.Contains(r.stdout, "removed 1 of 1 image(s)") {
		t.Fatalf("gc once no conversation is live: %d %s %s", r.code, r.stdout, r.stderr)
	}
}
