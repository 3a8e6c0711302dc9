// Package config loads imgctx's configuration: built-in defaults, then one
// YAML file, then IMGCTX_* environment variables, then command-line flags,
// each layer overriding the one before. Every key and its variable are
// documented in docs/config.md; a test fails when one is not.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"path"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/tokens"
	kyaml "github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
	"go.yaml.in/yaml/v3"
)

// Config is the whole configuration. The zero value of a field means its
// default (Defaults fills them in).
type Config struct {
	DataDir    string           `yaml:"data_dir" doc:"directory of the image store and the session database"`
	Server     Server           `yaml:"server"`
	Auth       Auth             `yaml:"auth"`
	Keep       Keep             `yaml:"keep"`
	Proxy      Proxy            `yaml:"proxy"`
	Store      Store            `yaml:"store"`
	Storage    Storage          `yaml:"storage"`
	Media      Media            `yaml:"media"`
	Upstream   Upstream         `yaml:"upstream"`
	Compaction Compaction       `yaml:"compaction"`
	Micro      Micro            `yaml:"micro"`
	Replay     Replay           `yaml:"replay"`
	Log        Log              `yaml:"log"`
	RequestLog RequestLog       `yaml:"request_log"`
	Trace      Trace            `yaml:"trace"`
	UI         UI               `yaml:"ui"`
	Profiles   []tokens.Profile `yaml:"profiles" env:"-"`
	Upstreams  []Route          `yaml:"upstreams" env:"-"`
}

// Route is one entry of the upstreams list: a model server the drop-in
// routes send requests of its format and models to.
type Route struct {
	Name          string   `yaml:"name"`
	Format        string   `yaml:"format"`
	BaseURL       string   `yaml:"base_url"`
	APIKey        string   `yaml:"api_key"`
	Models        []string `yaml:"models"`
	Vision        string   `yaml:"vision"`
	ContextWindow int      `yaml:"context_window"`
	FileIDs       string   `yaml:"file_ids"`
}

// Server configures imgctx serve.
type Server struct {
	Addr            string        `yaml:"addr" doc:"address to listen on"`
	MaxBodyBytes    int64         `yaml:"max_body_bytes" doc:"largest request body accepted, after decompression"`
	MaxConcurrent   int           `yaml:"max_concurrent" doc:"requests in flight at most; past it the gateway answers 429"`
	RequestTimeout  time.Duration `yaml:"request_timeout" doc:"time limit of one request, upstream included"`
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout" doc:"how long a graceful shutdown waits for requests in flight"`
	DrainDelay      time.Duration `yaml:"drain_delay" doc:"on SIGTERM, how long /readyz answers 503 (draining) while requests are still served, before shutting down"`
	MaxPerTenant    int           `yaml:"max_concurrent_per_tenant" doc:"requests one tenant may have in flight; 0: three quarters of max_concurrent with auth keys, else all"`
	MaxInflight     int64         `yaml:"max_inflight_bytes" doc:"request bodies held at once, in bytes; past it 429"`
	BodyTimeout     time.Duration `yaml:"body_timeout" doc:"time a request body may take to arrive, plus its length at min_body_rate"`
	MinBodyRate     int64         `yaml:"min_body_rate" doc:"slowest accepted body upload, in bytes per second"`
	MaxMessages     int           `yaml:"max_messages" doc:"messages one proxied request may hold; past it 413"`
	MaxParts        int           `yaml:"max_parts" doc:"content parts one proxied request may hold; past it 413"`
}

// Auth configures API keys.
type Auth struct {
	Keys          string `yaml:"keys" doc:"API keys and their tenants, as key=tenant,key=tenant; empty: no authentication, one tenant"`
	PassClientKey bool   `yaml:"pass_client_key" doc:"forward a client's X-Upstream-Api-Key header as the upstream key"`
	UpstreamKeys  string `yaml:"upstream_keys" doc:"upstream keys per tenant, as tenant=key,tenant=key, used with auth.keys"`
}

// Keep configures keeping tool images across turns.
type Keep struct {
	BudgetFraction float64       `yaml:"budget_fraction" doc:"share of the context window kept tool images may use"`
	LowWater       float64       `yaml:"low_water" doc:"share of the keep budget an eviction batch comes down to, so several more images fit before the next batch"`
	CacheTTL       time.Duration `yaml:"cache_ttl" doc:"how long the provider keeps a prompt cache warm; a proxied conversation idle longer evicts at its next turn at once"`
	Sight          float64       `yaml:"sight" doc:"what showing a kept image for one more request is worth, in multiples of reading it from the provider's cache: 0 cheapest, 1 (default) never pay a prefix break to stop reading an image, higher keeps images across cold caches; price decides when images leave (docs/config.md, Sight)"`
	HourCache      bool          `yaml:"hour_cache" doc:"the sessions API gives its cache breakpoints the provider's one-hour lifetime (Anthropic) once a turn came after the default lifetime and within the hour; the proxy owns no breakpoints"`
	Hold           bool          `yaml:"hold" doc:"while a provider that bills cache writes (Anthropic) still caches a proxied conversation, keep measured tool images over the budget; the budget applies when the cache goes cold, under window pressure and at the provider's image limit, in batches"`
}

// Proxy configures proxied conversations (the drop-in routes).
type Proxy struct {
	KeepTurnImages bool          `yaml:"keep_turn_images" doc:"keep tool images across turns in proxied conversations (a client may say X-Imgctx-Keep-Turn-Images: on or off)"`
	IdleExpiry     time.Duration `yaml:"idle_expiry" doc:"a proxied conversation's decisions are deleted after this long without a request"`
	MaxImages      int           `yaml:"max_images" doc:"image decisions kept per proxied conversation; past it they start over"`
	WindowRelief   float64       `yaml:"window_relief" doc:"share of the context window past which images leave a proxied request (reason window; compaction.threshold if higher): the default 1 leaves the window to the client's own compaction, which an earlier relief only postpones"`
	ClientWindow   bool          `yaml:"client_window" doc:"refuse, as the provider would have, a request whose history as the client sent it (the images imgctx took out back in) is past the window where its text fills over half of it: a client that compacts when refused compacts where it would have without imgctx"`
	Recall         bool          `yaml:"recall" doc:"image markers carry a handle for the imgctx_recall tool (MCP at /mcp); off: a model told of a tool its agent lacks tries it (a client may say X-Imgctx-Recall: on or off)"`
}

// RequestLog configures the request log (docs/api.md "Request log").
type RequestLog struct {
	Enabled   bool          `yaml:"enabled" doc:"keep a line per request (tokens, dollars, images sent and not sent, cache breaks; never message text) in the session store, for GET /v1/requests"`
	Retention time.Duration `yaml:"retention" doc:"lines older than this are deleted"`
	MaxRows   int           `yaml:"max_rows" doc:"lines kept at most, the newest"`
}

// UI configures the dashboard (docs/api.md "Dashboard").
type UI struct {
	Enabled  bool   `yaml:"enabled" doc:"serve the dashboard at /ui to loopback clients (with auth.keys, the tenant of the key given as the Basic-auth password)"`
	AdminKey string `yaml:"admin_key" doc:"key that opens the dashboard from anywhere, every tenant (the Basic-auth password or a Bearer token); never logged"`
}

// Trace configures OpenTelemetry traces (docs/api.md "Traces").
type Trace struct {
	Endpoint    string  `yaml:"endpoint" doc:"OTLP/HTTP traces URL of a collector (http://127.0.0.1:4318/v1/traces); empty: no traces"`
	SampleRatio float64 `yaml:"sample_ratio" doc:"share of requests traced when the client sent no sampled traceparent, in [0, 1]"`
	ServiceName string  `yaml:"service_name" doc:"service.name of the spans"`
}

// Store configures the image store.
type Store struct {
	EncryptKeyFile string `yaml:"encrypt_key_file" doc:"file holding a 32-byte master key (hex, base64 or raw); enables AES-256-GCM at rest"`
	NoSync         bool   `yaml:"no_sync" doc:"skip fsync on writes (throwaway data only)"`
}

// Storage chooses the backends: embedded in data_dir by default, or a
// PostgreSQL server and an S3-compatible bucket that replicas share.
type Storage struct {
	Sessions string   `yaml:"sessions" doc:"session store: sqlite (imgctx.db in data_dir) or postgres (storage.postgres.dsn)"`
	Images   string   `yaml:"images" doc:"image store: fs (images/ in data_dir) or s3 (storage.s3.*)"`
	Postgres Postgres `yaml:"postgres"`
	S3       S3       `yaml:"s3"`
	// Per-tenant shares of the image store (0: none).
	TenantMaxBytes  int64 `yaml:"tenant_max_bytes" doc:"bytes of images one tenant may keep in the image store (0: no limit)"`
	TenantMaxImages int   `yaml:"tenant_max_images" doc:"images one tenant may keep in the image store (0: no limit)"`
}

// Postgres reaches the session database.
type Postgres struct {
	DSN string `yaml:"dsn" doc:"PostgreSQL URL or key=value string (postgres://user:password@host:5432/db); never logged"`
}

// S3 reaches the image bucket.
type S3 struct {
	Endpoint  string `yaml:"endpoint" doc:"S3 server URL; the scheme chooses TLS (https://s3.eu-west-1.amazonaws.com, http://127.0.0.1:7070)"`
	Bucket    string `yaml:"bucket" doc:"bucket holding the images; it must exist"`
	Prefix    string `yaml:"prefix" doc:"key prefix before <tenant>/<ref>, e.g. imgctx/"`
	Region    string `yaml:"region" doc:"region; empty: the server's default"`
	AccessKey string `yaml:"access_key" doc:"access key ID"`
	SecretKey string `yaml:"secret_key" doc:"secret access key; never logged"`
}

// Media configures ingestion of untrusted images.
type Media struct {
	MaxImageBytes     int64         `yaml:"max_image_bytes" doc:"largest image or document accepted, in bytes"`
	MaxPixels         int64         `yaml:"max_pixels" doc:"largest width×height accepted, checked from the header"`
	MaxPDFPages       int           `yaml:"max_pdf_pages" doc:"most pages a PDF may have (its page tree's count)"`
	MaxPDFInflated    int64         `yaml:"max_pdf_inflated" doc:"most bytes a PDF's compressed streams may inflate to, together (a deflate bomb is refused)"`
	ShrinkMaxEdge     int           `yaml:"shrink_max_edge" doc:"longest edge when an image is shrunk, in pixels"`
	ShrinkTargetBytes int64         `yaml:"shrink_target_bytes" doc:"target size when an image is shrunk, in bytes"`
	ShrinkPerRequest  int64         `yaml:"shrink_max_pixels_per_request" doc:"pixels one request's shrinking may decode; past it 413"`
	ShrinkMemory      int64         `yaml:"shrink_memory" doc:"bytes decoding and scaling images for shrinking and thumbnails may hold at once, across requests; one tenant half of it at most"`
	ShrinkWait        time.Duration `yaml:"shrink_wait" doc:"how long a decode waits for memory before its request is answered 503 with Retry-After"`
	Fetch             Fetch         `yaml:"fetch"`
}

// Fetch configures downloads of image URLs.
type Fetch struct {
	Timeout       time.Duration `yaml:"timeout" doc:"time limit of one fetch"`
	MaxBytes      int64         `yaml:"max_bytes" doc:"largest body fetched, in bytes"`
	MaxRedirects  int           `yaml:"max_redirects" doc:"redirects followed at most"`
	AllowLoopback bool          `yaml:"allow_loopback" doc:"let URLs reach 127.0.0.0/8 and ::1 (tests and local development only)"`
}

// Upstream configures the model engine imgctx talks to.
type Upstream struct {
	Format        string        `yaml:"format" doc:"wire format of the upstream: openai (also llama.cpp, vLLM, Ollama, LM Studio) or anthropic"`
	BaseURL       string        `yaml:"base_url" doc:"base URL of the upstream, without /v1"`
	APIKey        string        `yaml:"api_key" doc:"API key sent to the upstream"`
	Timeout       time.Duration `yaml:"timeout" doc:"time limit of one upstream request"`
	MaxRetries    int           `yaml:"max_retries" doc:"retries after a 429, 5xx or 529"`
	Vision        string        `yaml:"vision" doc:"auto (from the model profile), true or false: whether this upstream sees images"`
	ContextWindow int           `yaml:"context_window" doc:"context window of this upstream in tokens; 0 takes the model profile's"`
	MaxResponse   int64         `yaml:"max_response_bytes" doc:"largest non-streamed answer taken from an upstream; larger is a 502 naming the limit"`
	FileIDs       string        `yaml:"file_ids" doc:"off or auto: auto uploads each image once to the provider's Files API and sends its file id (Anthropic Messages, OpenAI Responses, Gemini); it stores the user's images at the provider"`
}

// Compaction configures compaction's estimates.
type Compaction struct {
	ImageTokenEstimate     int     `yaml:"image_token_estimate" env:"IMGCTX_IMAGE_TOKEN_ESTIMATE" doc:"flat token estimate per image or document in compaction's character accounting"`
	Threshold              float64 `yaml:"threshold" doc:"share of the context window past which, before a request, kept images leave and then compaction runs"`
	PreserveFraction       float64 `yaml:"preserve_fraction" doc:"share of the history's characters kept verbatim at its end; the summary covers the rest"`
	MinCompressionFraction float64 `yaml:"min_compression_fraction" doc:"no summary when the prefix to summarise is under this share of the history"`
	RestoreImages          int     `yaml:"restore_images" doc:"most recent images the summary covers that are re-attached after it; 0: none"`
}

// Replay bounds the history images sent to a flat upstream (llama.cpp
// /completion, Ollama /api/generate): one prompt and one image list.
type Replay struct {
	MaxHistoryImages     int   `yaml:"max_history_images" doc:"history images attached to a flat upstream's request, newest turn first; 0: none (still counted)"`
	MaxHistoryImageBytes int64 `yaml:"max_history_image_bytes" doc:"bytes of history images attached to a flat upstream's request"`
	MaxHistoryChars      int   `yaml:"max_history_chars" doc:"history text replayed to a flat upstream, newest turn first; older turns are left out (counted truncated); 0: no limit"`
}

// Micro configures microcompaction: clearing stale tool output and media
// once the provider's cache is cold anyway.
type Micro struct {
	IdleAfter             time.Duration `yaml:"idle_after" doc:"how long a session is idle before stale content is cleared; 0 or off turns microcompaction off"`
	KeepRecentTool        int           `yaml:"keep_recent_tool" doc:"most recent results of compactable tools kept whole"`
	KeepRecentMedia       int           `yaml:"keep_recent_media" doc:"most recent images and documents of user messages kept"`
	KeepRecentNestedMedia int           `yaml:"keep_recent_nested_media" doc:"most recent tool results with media (other tools) whose media is kept"`
	CompactableTools      string        `yaml:"compactable_tools" doc:"tools whose results are cleared whole, comma-separated"`
	MaxToolBytes          int           `yaml:"max_tool_bytes" doc:"past this many bytes of compactable tool output before the turn, clear the oldest down to half of it, idle or not; 0: no size trigger"`
}

// Log configures logging.
type Log struct {
	Level  string `yaml:"level" doc:"debug, info, warn or error"`
	Format string `yaml:"format" doc:"text or json"`
}

// ReplayConfig is the flat upstreams' history-image setting.
func (c Config) ReplayConfig() *policy.ReplayConfig {
	return &policy.ReplayConfig{MaxHistoryImages: c.Replay.MaxHistoryImages, MaxHistoryImageBytes: c.Replay.MaxHistoryImageBytes,
		MaxHistoryChars: c.Replay.MaxHistoryChars, Vision: true}
}

// CompactConfig is the engine's compaction setting.
func (c Config) CompactConfig() policy.CompactConfig {
	restore := c.Compaction.RestoreImages
	if restore == 0 {
		restore = -1 // none; the policy's zero means its default
	}
	return policy.CompactConfig{ImageTokenEstimate: c.Compaction.ImageTokenEstimate, PreserveFraction: c.Compaction.PreserveFraction,
		MinCompressionFraction: c.Compaction.MinCompressionFraction, RestoreImages: restore}
}

// MicroConfig is the engine's microcompaction setting.
func (c Config) MicroConfig() policy.MicroConfig {
	m := c.Micro
	var tools []string
	for _, t := range strings.Split(m.CompactableTools, ",") {
		if t = strings.TrimSpace(t); t != "" {
			tools = append(tools, t)
		}
	}
	return policy.MicroConfig{IdleAfter: m.IdleAfter, Off: m.IdleAfter == 0, MaxToolBytes: m.MaxToolBytes, CompactableTools: tools,
		KeepRecent: policy.MicroKeep{Tool: m.KeepRecentTool, Media: m.KeepRecentMedia, NestedMedia: m.KeepRecentNestedMedia}}
}

// Defaults returns the configuration used when nothing is set.
func Defaults() Config {
	return Config{
		DataDir: "./imgctx-data",
		Storage: Storage{Sessions: "sqlite", Images: "fs"},
		Server: Server{Addr: "127.0.0.1:8080", MaxBodyBytes: 128 << 20, MaxConcurrent: 64, RequestTimeout: 10 * time.Minute, ShutdownTimeout: 30 * time.Second, DrainDelay: 5 * time.Second,
			MaxMessages: 10_000, MaxParts: 50_000, MaxInflight: 256 << 20, BodyTimeout: 10 * time.Second, MinBodyRate: 1 << 20},
		Keep:  Keep{BudgetFraction: 0.10, LowWater: 0.1, CacheTTL: 5 * time.Minute, Hold: true, Sight: policy.DefaultSight, HourCache: true},
		Proxy: Proxy{KeepTurnImages: true, IdleExpiry: 24 * time.Hour, MaxImages: 10_000, WindowRelief: 1, ClientWindow: true},
		Media: Media{
			MaxImageBytes:     media.DefaultMaxBytes,
			MaxPixels:         media.DefaultMaxPixels,
			MaxPDFPages:       media.DefaultMaxPDFPages,
			MaxPDFInflated:    media.DefaultMaxPDFInflated,
			ShrinkMaxEdge:     media.DefaultMaxEdge,
			ShrinkTargetBytes: media.DefaultTargetBytes,
			ShrinkPerRequest:  200_000_000,
			ShrinkMemory:      media.DefaultShrinkMemory,
			ShrinkWait:        10 * time.Second,
			Fetch:             Fetch{Timeout: media.DefaultFetchTimeout, MaxBytes: media.DefaultMaxBytes, MaxRedirects: media.DefaultMaxRedirects},
		},
		Upstream:   Upstream{Format: "openai", Timeout: 10 * time.Minute, MaxRetries: 2, Vision: "auto", MaxResponse: 64 << 20, FileIDs: "off"},
		Compaction: Compaction{ImageTokenEstimate: tokens.DefaultImageTokenEstimate, Threshold: 0.8, PreserveFraction: 0.3, MinCompressionFraction: 0.05, RestoreImages: 3},
		Replay:     Replay{MaxHistoryImages: 4, MaxHistoryImageBytes: 1_600_000},
		Micro: Micro{IdleAfter: 60 * time.Minute, KeepRecentTool: 1, KeepRecentMedia: 1, KeepRecentNestedMedia: 1,
			CompactableTools: "read_file,read_many_files,grep,glob,ls,shell,web_fetch,web_search"},
		Log:        Log{Level: "info", Format: "text"},
		RequestLog: RequestLog{Enabled: true, Retention: 7 * 24 * time.Hour, MaxRows: 100_000},
		Trace:      Trace{SampleRatio: 1, ServiceName: "imgctx"},
		UI:         UI{Enabled: true},
	}
}

// Key is one configuration key: its dotted name, its environment variable
// and what it means.
type Key struct {
	Name     string // "media.fetch.timeout"
	Env      string // "IMGCTX_MEDIA_FETCH_TIMEOUT"
	Doc      string
	Duration bool // a Go duration: "10s", "5m"; a bare number is refused
}

// Keys lists every scalar key of Config, derived from the struct itself so
// the list, the loader and the docs test cannot drift apart.
func Keys() []Key {
	var out []Key
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name := prefix + f.Tag.Get("yaml")
			if f.Type.Kind() == reflect.Struct && f.Type != reflect.TypeOf(time.Duration(0)) {
				walk(f.Type, name+".")
				continue
			}
			env := f.Tag.Get("env")
			if env == "-" {
				continue
			}
			if env == "" {
				env = "IMGCTX_" + strings.ToUpper(strings.ReplaceAll(name, ".", "_"))
			}
			out = append(out, Key{Name: name, Env: env, Doc: f.Tag.Get("doc"), Duration: f.Type == reflect.TypeOf(time.Duration(0))})
		}
	}
	walk(reflect.TypeOf(Config{}), "")
	return out
}

// Load builds the configuration from a YAML file (path may be ""), the
// environment (lookup; nil means os.LookupEnv) and flag overrides given as
// key → value.
func Load(path string, lookup func(string) (string, bool), flags map[string]any) (Config, error) {
	realEnv := lookup == nil
	if realEnv {
		lookup = os.LookupEnv
	}
	k := koanf.New(".")
	if path != "" {
		if err := k.Load(file.Provider(path), kyaml.Parser()); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", path, err)
		}
		if err := checkKnown(k.Keys()); err != nil {
			return Config{}, fmt.Errorf("config file %s: %w", path, err)
		}
	}
	if realEnv {
		if err := checkEnviron(os.Environ()); err != nil {
			return Config{}, err
		}
	}
	for _, key := range Keys() {
		if v, ok := lookup(key.Env); ok {
			if err := k.Set(key.Name, v); err != nil {
				return Config{}, fmt.Errorf("%s: %w", key.Env, err)
			}
		}
	}
	for name, v := range flags {
		if err := k.Set(name, v); err != nil {
			return Config{}, fmt.Errorf("flag for %s: %w", name, err)
		}
	}
	if v := k.Get("micro.idle_after"); v != nil {
		// "off" and a bare 0 turn microcompaction off: no unit needed.
		if s := strings.TrimSpace(fmt.Sprint(v)); s == "off" || s == "0" {
			k.Set("micro.idle_after", "0s")
		}
	}
	if err := checkDurations(k); err != nil {
		return Config{}, err
	}
	if err := checkProfileFields(k); err != nil {
		return Config{}, err
	}
	cfg := Defaults()
	if err := k.UnmarshalWithConf("", &cfg, koanf.UnmarshalConf{Tag: "yaml"}); err != nil {
		return Config{}, fmt.Errorf("config: %s: %w", sourceOf(err, path, lookup, flags), err)
	}
	cfg.Upstream.Vision = yamlBool(cfg.Upstream.Vision)
	cfg.Upstream.FileIDs = yamlOff(cfg.Upstream.FileIDs)
	for i := range cfg.Upstreams {
		cfg.Upstreams[i].Vision = yamlBool(cfg.Upstreams[i].Vision)
		cfg.Upstreams[i].FileIDs = yamlOff(cfg.Upstreams[i].FileIDs)
	}
	return cfg, cfg.Validate()
}

// yamlOff reads back file_ids: off, which YAML 1.1 readers take for
// false.
func yamlOff(s string) string {
	if s == "0" || s == "false" {
		return "off"
	}
	return s
}

// yamlBool reads back a YAML boolean given to a string setting (vision:
// false): the decoder hands it over as "0" or "1".
func yamlBool(s string) string {
	switch s {
	case "0":
		return "false"
	case "1":
		return "true"
	}
	return s
}

// sourceOf names where the value an unmarshal error is about came from:
// a flag, a variable or the file (the library's text names only the key).
func sourceOf(err error, path string, lookup func(string) (string, bool), flags map[string]any) string {
	for _, key := range Keys() {
		if !strings.Contains(err.Error(), "'"+key.Name+"'") {
			continue
		}
		if _, ok := flags[key.Name]; ok {
			return "the flag for " + key.Name
		}
		if _, ok := lookup(key.Env); ok {
			return "variable " + key.Env
		}
		if path != "" {
			return "file " + path + ", key " + key.Name
		}
		return key.Name
	}
	if path != "" {
		return "file " + path
	}
	return "the settings"
}

// checkEnviron refuses an IMGCTX_ variable that names no key: a typo
// never silently does nothing.
func checkEnviron(environ []string) error {
	known := map[string]bool{}
	for _, k := range Keys() {
		known[k.Env] = true
	}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "IMGCTX_") && !known[name] {
			return fmt.Errorf("unknown variable %s (docs/config.md lists the variables)", name)
		}
	}
	return nil
}

// checkProfileFields refuses a field the profiles or upstreams of the file
// do not have (a typo in a profile would otherwise be dropped silently).
func checkProfileFields(k *koanf.Koanf) error {
	for _, c := range []struct {
		key  string
		into any
	}{{"profiles", &[]tokens.Profile{}}, {"upstreams", &[]Route{}}} {
		v := k.Get(c.key)
		if v == nil {
			continue
		}
		b, err := yaml.Marshal(v)
		if err != nil {
			return fmt.Errorf("%s: %w", c.key, err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(c.into); err != nil {
			return fmt.Errorf("%s: %w", c.key, err)
		}
	}
	return nil
}

// checkDurations refuses a duration given as a bare number: "10" would
// be read as 10 nanoseconds, and every request would time out.
func checkDurations(k *koanf.Koanf) error {
	for _, key := range Keys() {
		if !key.Duration || !k.Exists(key.Name) {
			continue
		}
		switch v := k.Get(key.Name).(type) {
		case int, int64, float64, uint64:
			return fmt.Errorf("%s: %v has no unit; write it as a duration such as %vs or %vm (%s)", key.Name, v, v, v, key.Env)
		case string:
			if _, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil {
				return fmt.Errorf("%s: %q has no unit; write it as a duration such as %ss or %sm (%s)", key.Name, v, strings.TrimSpace(v), strings.TrimSpace(v), key.Env)
			}
		}
	}
	return nil
}

// replaced are keys of earlier versions, with what to write instead.
var replaced = map[string]string{
	"media.shrink_pixels_at_once": "media.shrink_memory bounds the bytes decodes hold (a decoded pixel and its scaling cost about 37 bytes: 100000000 pixels were about 3.5 GB; the default is 536870912)",
}

// checkKnown refuses keys the configuration does not have, so a typo is an
// error rather than a silently ignored setting.
func checkKnown(keys []string) error {
	known := map[string]bool{}
	for _, k := range Keys() {
		known[k.Name] = true
	}
	for _, k := range keys {
		if now, ok := replaced[k]; ok {
			return fmt.Errorf("%s was replaced: %s", k, now)
		}
		if known[k] || k == "profiles" || strings.HasPrefix(k, "profiles.") || k == "upstreams" || strings.HasPrefix(k, "upstreams.") {
			continue
		}
		return fmt.Errorf("unknown key %q (docs/config.md lists the keys)", k)
	}
	return nil
}

// Validate checks each field, naming the key of the first bad one.
func (c Config) Validate() error {
	var errs []error
	positive := func(key string, v int64) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s: must be positive (got %d)", key, v))
		}
	}
	if _, _, err := net.SplitHostPort(c.Server.Addr); err != nil {
		errs = append(errs, fmt.Errorf("server.addr: %q is not host:port (127.0.0.1:8080, :8080): %v", c.Server.Addr, err))
	}
	positive("server.max_body_bytes", c.Server.MaxBodyBytes)
	positive("server.max_concurrent", int64(c.Server.MaxConcurrent))
	positive("server.request_timeout", int64(c.Server.RequestTimeout))
	positive("server.max_messages", int64(c.Server.MaxMessages))
	positive("server.max_inflight_bytes", c.Server.MaxInflight)
	positive("server.body_timeout", int64(c.Server.BodyTimeout))
	positive("server.min_body_rate", c.Server.MinBodyRate)
	if c.Server.MaxPerTenant < 0 {
		errs = append(errs, errors.New("server.max_concurrent_per_tenant: must not be negative"))
	}
	positive("server.max_parts", int64(c.Server.MaxParts))
	if c.Keep.BudgetFraction <= 0 || c.Keep.BudgetFraction >= 1 {
		errs = append(errs, fmt.Errorf("keep.budget_fraction: must be between 0 and 1 (got %v)", c.Keep.BudgetFraction))
	}
	if c.Keep.LowWater <= 0 || c.Keep.LowWater >= 1 {
		errs = append(errs, fmt.Errorf("keep.low_water: must be between 0 and 1 (got %v)", c.Keep.LowWater))
	}
	positive("keep.cache_ttl", int64(c.Keep.CacheTTL))
	if c.Keep.Sight < 0 || math.IsNaN(c.Keep.Sight) {
		errs = append(errs, fmt.Errorf("keep.sight: must be 0 or more (got %v)", c.Keep.Sight))
	}
	if c.Storage.TenantMaxBytes < 0 || c.Storage.TenantMaxImages < 0 {
		errs = append(errs, errors.New("storage.tenant_max_bytes, storage.tenant_max_images: must not be negative (0: no limit)"))
	}
	if c.Server.DrainDelay < 0 {
		errs = append(errs, errors.New("server.drain_delay: must not be negative (0: shut down at once)"))
	}
	positive("proxy.idle_expiry", int64(c.Proxy.IdleExpiry))
	positive("request_log.retention", int64(c.RequestLog.Retention))
	positive("request_log.max_rows", int64(c.RequestLog.MaxRows))
	if c.Trace.SampleRatio < 0 || c.Trace.SampleRatio > 1 || math.IsNaN(c.Trace.SampleRatio) {
		errs = append(errs, fmt.Errorf("trace.sample_ratio: must be between 0 and 1 (got %v)", c.Trace.SampleRatio))
	}
	positive("proxy.max_images", int64(c.Proxy.MaxImages))
	if _, err := c.APIKeys(); err != nil {
		errs = append(errs, err)
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("data_dir: must not be empty"))
	}
	errs = append(errs, c.Storage.check()...)
	positive("media.max_image_bytes", c.Media.MaxImageBytes)
	positive("media.max_pixels", c.Media.MaxPixels)
	positive("media.max_pdf_pages", int64(c.Media.MaxPDFPages))
	positive("media.max_pdf_inflated", c.Media.MaxPDFInflated)
	positive("media.shrink_max_edge", int64(c.Media.ShrinkMaxEdge))
	positive("media.shrink_target_bytes", c.Media.ShrinkTargetBytes)
	positive("media.shrink_max_pixels_per_request", c.Media.ShrinkPerRequest)
	positive("media.shrink_memory", c.Media.ShrinkMemory)
	positive("media.shrink_wait", int64(c.Media.ShrinkWait))
	positive("media.fetch.timeout", int64(c.Media.Fetch.Timeout))
	positive("media.fetch.max_bytes", c.Media.Fetch.MaxBytes)
	if c.Media.Fetch.MaxRedirects < 0 || c.Media.Fetch.MaxRedirects > 10 {
		errs = append(errs, fmt.Errorf("media.fetch.max_redirects: must be 0 to 10 (got %d)", c.Media.Fetch.MaxRedirects))
	}
	positive("compaction.image_token_estimate", int64(c.Compaction.ImageTokenEstimate))
	for _, f := range []struct {
		key    string
		v      float64
		closed bool // 1 allowed
	}{{"compaction.threshold", c.Compaction.Threshold, true}, {"proxy.window_relief", c.Proxy.WindowRelief, true}, {"compaction.preserve_fraction", c.Compaction.PreserveFraction, false},
		{"compaction.min_compression_fraction", c.Compaction.MinCompressionFraction, false}} {
		if f.v <= 0 || f.v > 1 || f.v == 1 && !f.closed {
			errs = append(errs, fmt.Errorf("%s: must be between 0 and 1 (got %v)", f.key, f.v))
		}
	}
	if c.Micro.IdleAfter < 0 {
		errs = append(errs, fmt.Errorf("micro.idle_after: must not be negative (0 or off turns microcompaction off)"))
	}
	for key, v := range map[string]int{"micro.keep_recent_tool": c.Micro.KeepRecentTool, "micro.keep_recent_media": c.Micro.KeepRecentMedia,
		"micro.keep_recent_nested_media": c.Micro.KeepRecentNestedMedia, "micro.max_tool_bytes": c.Micro.MaxToolBytes,
		"compaction.restore_images": c.Compaction.RestoreImages, "replay.max_history_images": c.Replay.MaxHistoryImages,
		"replay.max_history_chars": c.Replay.MaxHistoryChars, "replay.max_history_image_bytes": int(c.Replay.MaxHistoryImageBytes)} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative (got %d)", key, v))
		}
	}
	if !slices.Contains([]string{"openai", "anthropic", "gemini", "llamacpp", "ollama"}, c.Upstream.Format) {
		errs = append(errs, fmt.Errorf("upstream.format: %q is not openai, anthropic, gemini, llamacpp or ollama", c.Upstream.Format))
	}
	if !slices.Contains([]string{"auto", "true", "false"}, c.Upstream.Vision) {
		errs = append(errs, fmt.Errorf("upstream.vision: %q is not auto, true or false", c.Upstream.Vision))
	}
	if !slices.Contains([]string{"off", "auto"}, c.Upstream.FileIDs) {
		errs = append(errs, fmt.Errorf("upstream.file_ids: %q is not off or auto", c.Upstream.FileIDs))
	}
	if c.Upstream.BaseURL != "" {
		if err := checkBaseURL(c.Upstream.BaseURL, c.Server.Addr); err != nil {
			errs = append(errs, fmt.Errorf("upstream.base_url: %w", err))
		}
	}
	names := map[string]bool{}
	for i, r := range c.Upstreams {
		key := fmt.Sprintf("upstreams[%d]", i)
		switch {
		case r.Name == "":
			errs = append(errs, fmt.Errorf("%s.name: must be set", key))
		case names[r.Name]:
			errs = append(errs, fmt.Errorf("%s.name: %q is used twice", key, r.Name))
		}
		names[r.Name] = true
		if !slices.Contains([]string{"openai", "anthropic", "gemini", "llamacpp", "ollama"}, r.Format) {
			errs = append(errs, fmt.Errorf("%s.format: %q is not openai, anthropic, gemini, llamacpp or ollama", key, r.Format))
		}
		if err := checkBaseURL(r.BaseURL, c.Server.Addr); err != nil {
			errs = append(errs, fmt.Errorf("%s.base_url: %w", key, err))
		}
		if !slices.Contains([]string{"", "auto", "true", "false"}, r.Vision) {
			errs = append(errs, fmt.Errorf("%s.vision: %q is not auto, true or false", key, r.Vision))
		}
		if !slices.Contains([]string{"", "off", "auto"}, r.FileIDs) {
			errs = append(errs, fmt.Errorf("%s.file_ids: %q is not off or auto", key, r.FileIDs))
		}
		if r.ContextWindow < 0 {
			errs = append(errs, fmt.Errorf("%s.context_window: must not be negative", key))
		}
		for _, m := range r.Models {
			if _, err := path.Match(m, ""); err != nil {
				errs = append(errs, fmt.Errorf("%s.models: bad pattern %q", key, m))
			}
		}
	}
	if _, err := c.TenantUpstreamKeys(); err != nil {
		errs = append(errs, err)
	}
	positive("upstream.timeout", int64(c.Upstream.Timeout))
	positive("upstream.max_response_bytes", c.Upstream.MaxResponse)
	if c.Upstream.ContextWindow < 0 || c.Upstream.MaxRetries < 0 {
		errs = append(errs, errors.New("upstream.context_window and upstream.max_retries must not be negative"))
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, c.Log.Level) {
		errs = append(errs, fmt.Errorf("log.level: %q is not debug, info, warn or error", c.Log.Level))
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		errs = append(errs, fmt.Errorf("log.format: %q is not text or json", c.Log.Format))
	}
	if _, err := tokens.Default().With(c.Profiles...); err != nil {
		errs = append(errs, fmt.Errorf("profiles: %w", err))
	}
	return errors.Join(errs...)
}

// ProfileTable is the embedded profile table with the config's overrides.
func (c Config) ProfileTable() (*tokens.Table, error) {
	return tokens.Default().With(c.Profiles...)
}

// MediaLimits returns the ingestion limits.
func (c Config) MediaLimits() media.Limits {
	return media.Limits{MaxBytes: c.Media.MaxImageBytes, MaxPixels: c.Media.MaxPixels, MaxPDFPages: c.Media.MaxPDFPages, MaxPDFInflated: c.Media.MaxPDFInflated}
}

// checkBaseURL refuses a base URL imgctx cannot use, saying what to write
// instead: one without a scheme, one ending in /v1 (imgctx adds the
// /v1/… path itself), one that points at the gateway's own address.
func checkBaseURL(raw, self string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return fmt.Errorf("%q has no scheme or host; write it as https://%s", raw, strings.TrimPrefix(strings.TrimPrefix(raw, "//"), "/"))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q: the scheme must be http or https", raw)
	}
	if p := strings.TrimRight(u.Path, "/"); strings.HasSuffix(p, "/v1") {
		fixed := *u
		fixed.Path = strings.TrimSuffix(p, "/v1")
		return fmt.Errorf("%q ends in /v1; write %s (imgctx adds /v1/… itself)", raw, fixed.String())
	}
	if sameAddr(u, self) {
		return fmt.Errorf("%q is this gateway's own address (server.addr %s): point it at the model server", raw, self)
	}
	return nil
}

// sameAddr reports whether u names the address the gateway listens on.
func sameAddr(u *url.URL, self string) bool {
	host, port, err := net.SplitHostPort(self)
	if err != nil {
		return false
	}
	uport := u.Port()
	if uport == "" {
		uport = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	if uport != port {
		return false
	}
	local := func(h string) bool {
		ip := net.ParseIP(h)
		return h == "" || h == "localhost" || ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
	}
	uh := u.Hostname()
	return uh == host || local(uh) && local(host)
}

// pairs parses "a=b,a=b" into a map. An error says which entry is wrong
// by its position, never by its text: the values are credentials.
func pairs(key, raw, form string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(raw) == "" {
		return out, nil
	}
	for i, pair := range strings.Split(raw, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || a == "" || b == "" {
			return nil, fmt.Errorf("%s: entry %d is not %s", key, i+1, form)
		}
		out[a] = b
	}
	return out, nil
}

// TenantUpstreamKeys parses auth.upstream_keys ("tenant=key,…").
func (c Config) TenantUpstreamKeys() (map[string]string, error) {
	return pairs("auth.upstream_keys", c.Auth.UpstreamKeys, "tenant=key")
}

// APIKeys parses auth.keys ("key=tenant,key=tenant") into a map.
func (c Config) APIKeys() (map[string]string, error) {
	out, err := pairs("auth.keys", c.Auth.Keys, "key=tenant")
	if err != nil {
		return nil, err
	}
	for _, tenant := range out {
		if err := imagestore.ValidTenant(tenant); err != nil {
			return nil, fmt.Errorf("auth.keys: %w", err)
		}
	}
	return out, nil
}

func (s Storage) check() []error {
	var errs []error
	switch s.Sessions {
	case "sqlite":
	case "postgres":
		if s.Postgres.DSN == "" {
			errs = append(errs, errors.New("storage.postgres.dsn: must be set when storage.sessions is postgres (env IMGCTX_STORAGE_POSTGRES_DSN)"))
		}
	default:
		errs = append(errs, fmt.Errorf("storage.sessions: %q is not sqlite or postgres", s.Sessions))
	}
	switch s.Images {
	case "fs":
	case "s3":
		if s.S3.Endpoint == "" {
			errs = append(errs, errors.New("storage.s3.endpoint: must be set when storage.images is s3"))
		} else if u, err := url.Parse(s.S3.Endpoint); err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			errs = append(errs, fmt.Errorf("storage.s3.endpoint: %q is not an http:// or https:// URL", s.S3.Endpoint))
		}
		if s.S3.Bucket == "" {
			errs = append(errs, errors.New("storage.s3.bucket: must be set when storage.images is s3"))
		}
		if (s.S3.AccessKey == "") != (s.S3.SecretKey == "") {
			errs = append(errs, errors.New("storage.s3.access_key and storage.s3.secret_key: set both or neither"))
		}
	default:
		errs = append(errs, fmt.Errorf("storage.images: %q is not fs or s3", s.Images))
	}
	return errs
}
