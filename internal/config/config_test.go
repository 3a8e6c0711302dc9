package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func writeFile(t *testing.T, body string) string {
	p := filepath.Join(t.TempDir(), "imgctx.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestDefaultsAreValid(t *testing.T) {
	cfg, err := Load("", env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DataDir != "./imgctx-data" || cfg.Compaction.ImageTokenEstimate != 1600 || cfg.Media.Fetch.Timeout != 10*time.Second {
		t.Fatalf("defaults: %+v", cfg)
	}
}

func TestLayersOverrideInOrder(t *testing.T) {
	path := writeFile(t, `
data_dir: /srv/imgctx
media:
  max_image_bytes: 2000000
  fetch:
    timeout: 3s
compaction:
  image_token_estimate: 1200
profiles:
  - name: llava
    match: ["llava*"]
    family: ollama
    context_window: 4096
    vision: true
    tokenizer: chars4
    image: {rule: fixed, tokens: 576}
    cache: {ttl: 5m}
`)
	cfg, err := Load(path, env(map[string]string{
		"IMGCTX_IMAGE_TOKEN_ESTIMATE":  "900", // the seed's documented alias
		"IMGCTX_MEDIA_MAX_IMAGE_BYTES": "3000000",
		"IMGCTX_DATA_DIR":              "/from/env",
	}), map[string]any{"data_dir": "/from/flag"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.DataDir != "/from/flag" {
		t.Errorf("flag did not win: %s", cfg.DataDir)
	}
	if cfg.Media.MaxImageBytes != 3000000 || cfg.Compaction.ImageTokenEstimate != 900 {
		t.Errorf("env did not override the file: %d %d", cfg.Media.MaxImageBytes, cfg.Compaction.ImageTokenEstimate)
	}
	if cfg.Media.Fetch.Timeout != 3*time.Second || cfg.Media.MaxPixels != 40_000_000 {
		t.Errorf("file value or untouched default lost: %v %d", cfg.Media.Fetch.Timeout, cfg.Media.MaxPixels)
	}
	tbl, err := cfg.ProfileTable()
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := tbl.Lookup("llava:7b"); !ok || p.Image.Tokens != 576 || p.Cache.TTL != 5*time.Minute {
		t.Errorf("profile from the file not used: %+v", p)
	}
}

func TestUpstreamsList(t *testing.T) {
	path := writeFile(t, "upstreams:\n  - name: claude\n    format: anthropic\n    base_url: https://api.anthropic.com\n    models: [\"claude-*\"]\n  - name: local\n    format: openai\n    base_url: http://127.0.0.1:11434\n    context_window: 32768\n")
	cfg, err := Load(path, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Upstreams) != 2 || cfg.Upstreams[0].Models[0] != "claude-*" || cfg.Upstreams[1].ContextWindow != 32768 {
		t.Fatalf("upstreams: %+v", cfg.Upstreams)
	}
}

// A plain YAML boolean is accepted where a setting reads auto, true or
// false (vision: false), as the docs write it.
func TestVisionTakesYAMLBooleans(t *testing.T) {
	path := writeFile(t, "upstream:\n  vision: false\nupstreams:\n  - name: local\n    format: llamacpp\n    base_url: http://127.0.0.1:8081\n    vision: true\n")
	cfg, err := Load(path, env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Upstream.Vision != "false" || cfg.Upstreams[0].Vision != "true" {
		t.Fatalf("vision %q and %q; want false and true", cfg.Upstream.Vision, cfg.Upstreams[0].Vision)
	}
}

func TestRefusals(t *testing.T) {
	cases := []struct {
		name, file string
		env        map[string]string
		want       string
	}{
		{"unknown key", "media:\n  max_image_byte: 5\n", nil, `unknown key "media.max_image_byte"`},
		{"replaced key", "media:\n  shrink_pixels_at_once: 100000000\n", nil, "media.shrink_pixels_at_once was replaced: media.shrink_memory"},
		{"negative", "media:\n  max_pixels: -1\n", nil, "media.max_pixels: must be positive"},
		{"bad level", "log:\n  level: loud\n", nil, "log.level"},
		{"bad env number", "", map[string]string{"IMGCTX_IMAGE_TOKEN_ESTIMATE": "lots"}, "image_token_estimate"},
		{"bad profile", "profiles:\n  - name: x\n    context_window: 10\n    tokenizer: o200k\n    vision: true\n    image: {rule: openai_tile}\n", nil, "base_tokens"},
		{"bad yaml", "media: [", nil, "config file"},
		{"base URL with /v1", "", map[string]string{"IMGCTX_UPSTREAM_BASE_URL": "https://api.openai.com/v1"}, "write https://api.openai.com (imgctx adds /v1"},
		{"base URL without scheme", "", map[string]string{"IMGCTX_UPSTREAM_BASE_URL": "api.anthropic.com"}, "write it as https://api.anthropic.com"},
		{"base URL is the gateway", "", map[string]string{"IMGCTX_UPSTREAM_BASE_URL": "http://localhost:8080"}, "this gateway's own address"},
		{"preserve fraction 0", "compaction:\n  preserve_fraction: 0\n", nil, `compaction.preserve_fraction: must be between 0 and 1`},
		{"preserve fraction 1", "compaction:\n  preserve_fraction: 1\n", nil, `compaction.preserve_fraction: must be between 0 and 1`},
		{"threshold over 1", "compaction:\n  threshold: 1.5\n", nil, `compaction.threshold: must be between 0 and 1`},
		{"window relief over 1", "", map[string]string{"IMGCTX_PROXY_WINDOW_RELIEF": "1.2"}, `proxy.window_relief: must be between 0 and 1`},
		{"window relief 0", "proxy:\n  window_relief: 0\n", nil, `proxy.window_relief: must be between 0 and 1`},
		{"negative idle", "micro:\n  idle_after: -1m\n", nil, `micro.idle_after: must not be negative`},
		{"negative keep", "micro:\n  keep_recent_media: -1\n", nil, `micro.keep_recent_media: must not be negative`},
		{"idle without unit", "micro:\n  idle_after: 30\n", nil, `micro.idle_after: 30 has no unit`},
		{"an unknown upstream format", "upstream:\n  format: grpc\n", nil, `"grpc" is not openai, anthropic, gemini, llamacpp or ollama`},
		{"upstream entry without format", "upstreams:\n  - name: a\n    base_url: http://127.0.0.1:9\n", nil, `upstreams[0].format: "" is not openai, anthropic, gemini, llamacpp or ollama`},
		{"upstream names twice", "upstreams:\n  - {name: a, format: openai, base_url: 'http://127.0.0.1:9'}\n  - {name: a, format: openai, base_url: 'http://127.0.0.1:10/v1'}\n", nil, `upstreams[1].name: "a" is used twice`},
		{"upstream keys", "", map[string]string{"IMGCTX_AUTH_UPSTREAM_KEYS": "acme"}, "auth.upstream_keys: entry 1 is not tenant=key"},
		// A malformed key entry is named by its position: its text is a credential.
		{"auth key without tenant", "", map[string]string{"IMGCTX_AUTH_KEYS": "sk-secret-123"}, "auth.keys: entry 1 is not key=tenant"},
		// Regression (issue "Hardening", item 15): wrong types named neither the file nor the variable.
		{"wrong type in a variable", "", map[string]string{"IMGCTX_SERVER_MAX_CONCURRENT": "lots"}, "variable IMGCTX_SERVER_MAX_CONCURRENT"},
		{"wrong type in the file", "server:\n  max_concurrent: lots\n", nil, "key server.max_concurrent"},
		{"profile field typo", "profiles:\n  - name: x\n    match: [\"x*\"]\n    contxt_window: 10\n", nil, "contxt_window"},
		{"upstream field typo", "upstreams:\n  - {name: a, format: openai, base_url: 'http://127.0.0.1:9', modles: [x]}\n", nil, "modles"},
		{"addr without port", "", map[string]string{"IMGCTX_SERVER_ADDR": "nonsense"}, "server.addr"},
		// Regression (issue "Hardening", item 15): read as 10 ns, every request timed out.
		{"duration without unit in the file", "server:\n  request_timeout: 10\n", nil, "server.request_timeout: 10 has no unit"},
		{"unknown session store", "", map[string]string{"IMGCTX_STORAGE_SESSIONS": "mysql"}, `storage.sessions: "mysql" is not sqlite or postgres`},
		{"postgres without a DSN", "storage:\n  sessions: postgres\n", nil, "storage.postgres.dsn: must be set"},
		{"unknown image store", "storage:\n  images: gcs\n", nil, `storage.images: "gcs" is not fs or s3`},
		{"s3 without a bucket", "storage:\n  images: s3\n  s3: {endpoint: 'http://127.0.0.1:7070'}\n", nil, "storage.s3.bucket: must be set"},
		{"s3 endpoint without scheme", "storage:\n  images: s3\n  s3: {endpoint: 's3.amazonaws.com', bucket: b}\n", nil, `storage.s3.endpoint: "s3.amazonaws.com" is not an http:// or https:// URL`},
		{"s3 secret without key", "", map[string]string{"IMGCTX_STORAGE_IMAGES": "s3", "IMGCTX_STORAGE_S3_ENDPOINT": "http://127.0.0.1:7070", "IMGCTX_STORAGE_S3_BUCKET": "b", "IMGCTX_STORAGE_S3_SECRET_KEY": "hunter2"}, "set both or neither"},
		{"duration without unit in the environment", "", map[string]string{"IMGCTX_MEDIA_FETCH_TIMEOUT": "30"}, `media.fetch.timeout: "30" has no unit`},
		// Each range check names its key and what it takes.
		{"budget fraction 1", "keep:\n  budget_fraction: 1\n", nil, "keep.budget_fraction: must be between 0 and 1 (got 1)"},
		{"low water 0", "", map[string]string{"IMGCTX_KEEP_LOW_WATER": "0"}, "keep.low_water: must be between 0 and 1 (got 0)"},
		{"negative sight", "keep:\n  sight: -0.5\n", nil, "keep.sight: must be 0 or more (got -0.5)"},
		{"negative per-tenant concurrency", "server:\n  max_concurrent_per_tenant: -1\n", nil, "server.max_concurrent_per_tenant: must not be negative"},
		{"negative tenant quota", "storage:\n  tenant_max_images: -1\n", nil, "storage.tenant_max_bytes, storage.tenant_max_images: must not be negative"},
		{"negative drain delay", "server:\n  drain_delay: -1s\n", nil, "server.drain_delay: must not be negative"},
		{"sample ratio over 1", "trace:\n  sample_ratio: 2\n", nil, "trace.sample_ratio: must be between 0 and 1 (got 2)"},
		{"empty data dir", "data_dir: ''\n", nil, "data_dir: must not be empty"},
		{"too many redirects", "media:\n  fetch:\n    max_redirects: 11\n", nil, "media.fetch.max_redirects: must be 0 to 10 (got 11)"},
		{"vision neither", "", map[string]string{"IMGCTX_UPSTREAM_VISION": "maybe"}, `upstream.vision: "maybe" is not auto, true or false`},
		{"file ids neither", "", map[string]string{"IMGCTX_UPSTREAM_FILE_IDS": "always"}, `upstream.file_ids: "always" is not off or auto`},
		{"negative window", "upstream:\n  context_window: -1\n", nil, "upstream.context_window and upstream.max_retries must not be negative"},
		{"log format", "log:\n  format: xml\n", nil, `log.format: "xml" is not text or json`},
		{"upstream entry without a name", "upstreams:\n  - {format: openai, base_url: 'http://127.0.0.1:9'}\n", nil, "upstreams[0].name: must be set"},
		{"upstream entry's vision", "upstreams:\n  - {name: a, format: openai, base_url: 'http://127.0.0.1:9', vision: maybe}\n", nil, `upstreams[0].vision: "maybe" is not auto, true or false`},
		{"upstream entry's file ids", "upstreams:\n  - {name: a, format: openai, base_url: 'http://127.0.0.1:9', file_ids: always}\n", nil, `upstreams[0].file_ids: "always" is not off or auto`},
		{"upstream entry's window", "upstreams:\n  - {name: a, format: openai, base_url: 'http://127.0.0.1:9', context_window: -5}\n", nil, "upstreams[0].context_window: must not be negative"},
		{"upstream entry's model pattern", "upstreams:\n  - {name: a, format: openai, base_url: 'http://127.0.0.1:9', models: ['gpt-[']}\n", nil, `upstreams[0].models: bad pattern "gpt-["`},
		{"s3 without an endpoint", "storage:\n  images: s3\n  s3: {bucket: b}\n", nil, "storage.s3.endpoint: must be set when storage.images is s3"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := ""
			if c.file != "" {
				path = writeFile(t, c.file)
			}
			_, err := Load(path, env(c.env), nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v; want an error mentioning %q", err, c.want)
			}
		})
	}
	if _, err := Load("/no/such/file.yaml", env(nil), nil); err == nil {
		t.Fatal("missing config file accepted")
	}
}

// Every key and its environment variable must be documented; this test is
// how docs/config.md stays complete.
func TestEveryKeyIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range Keys() {
		if !strings.Contains(string(doc), "`"+k.Name+"`") {
			t.Errorf("docs/config.md does not document key `%s`", k.Name)
		}
		if !strings.Contains(string(doc), "`"+k.Env+"`") {
			t.Errorf("docs/config.md does not document variable `%s`", k.Env)
		}
		if k.Doc == "" {
			t.Errorf("key %s has no doc tag", k.Name)
		}
	}
	for _, k := range []string{"`profiles`", "`upstreams`"} {
		if !strings.Contains(string(doc), k) {
			t.Errorf("docs/config.md does not document %s", k)
		}
	}
}

// Regression (issue "Hardening", item 15): an IMGCTX_ variable with a typo
// was ignored silently.
func TestUnknownVariableIsRefused(t *testing.T) {
	t.Setenv("IMGCTX_UPSTREAM_BASEURL", "http://127.0.0.1:9")
	if _, err := Load("", nil, nil); err == nil || !strings.Contains(err.Error(), "unknown variable IMGCTX_UPSTREAM_BASEURL") {
		t.Fatalf("got %v", err)
	}
}

// Credentials never appear in an error: a malformed auth.keys entry is
// named by its position.
func TestKeyErrorsDoNotEchoKeys(t *testing.T) {
	_, err := Load("", env(map[string]string{"IMGCTX_AUTH_KEYS": "k1=acme,sk-secret-123"}), nil)
	if err == nil || strings.Contains(err.Error(), "sk-secret-123") || !strings.Contains(err.Error(), "entry 2") {
		t.Fatalf("got %v", err)
	}
}

// Microcompaction: off by "off" or 0 (file or environment), on by default
// with the documented keep counts and tools; the compaction fractions reach
// the engine's settings.
func TestMicroAndCompactionSettings(t *testing.T) {
	for _, c := range []struct {
		file string
		env  map[string]string
		off  bool
	}{
		{"", nil, false},
		{"micro:\n  idle_after: off\n", nil, true},
		{"micro:\n  idle_after: 0\n", nil, true},
		{"", map[string]string{"IMGCTX_MICRO_IDLE_AFTER": "off"}, true},
		{"", map[string]string{"IMGCTX_MICRO_IDLE_AFTER": "15m"}, false},
	} {
		path := ""
		if c.file != "" {
			path = writeFile(t, c.file)
		}
		cfg, err := Load(path, env(c.env), nil)
		if err != nil {
			t.Fatalf("%q %v: %v", c.file, c.env, err)
		}
		if m := cfg.MicroConfig(); m.Off != c.off || len(m.CompactableTools) != 8 || m.KeepRecent.Tool != 1 {
			t.Errorf("%q %v: %+v", c.file, c.env, m)
		}
	}
	cfg, err := Load(writeFile(t, "compaction:\n  preserve_fraction: 0.2\nmicro:\n  compactable_tools: ' shell , grep '\n  max_tool_bytes: 200000\n"), env(nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if m := cfg.MicroConfig(); cfg.Compaction.PreserveFraction != 0.2 || len(m.CompactableTools) != 2 || m.CompactableTools[0] != "shell" || m.MaxToolBytes != 200000 {
		t.Fatalf("%+v %+v", cfg.Compaction, m)
	}
}
