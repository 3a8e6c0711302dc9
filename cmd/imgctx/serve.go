package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/gateway"
	"github.com/imgctx/imgctx/internal/config"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/upstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"go.opentelemetry.io/otel/trace"
)

func newServeCmd(a *app) *cobra.Command {
	var addr, up, format string
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the gateway: OpenAI/Anthropic-compatible proxy, image and sessions API",
		Long: "serve starts the gateway on embedded defaults: images under <data-dir>/images, sessions in\n" +
			"<data-dir>/imgctx.db (SQLite). Point it at any OpenAI- or Anthropic-compatible upstream with\n" +
			"--upstream (or IMGCTX_UPSTREAM_BASE_URL) and --upstream-format. docs/config.md lists every setting.",
		Example: "  imgctx serve --upstream https://api.anthropic.com --upstream-format anthropic\n" +
			"  IMGCTX_UPSTREAM_BASE_URL=http://127.0.0.1:8081 imgctx serve --addr :8080",
		Args: exactArgs(0),
		PreRunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("addr") {
				a.flagOverrides["server.addr"] = addr
			}
			if cmd.Flags().Changed("upstream") {
				a.flagOverrides["upstream.base_url"] = up
			}
			if cmd.Flags().Changed("upstream-format") {
				a.flagOverrides["upstream.format"] = format
			}
			return cmd.Root().PersistentPreRunE(cmd, args)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.serve(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "address to listen on (default 127.0.0.1:8080; env IMGCTX_SERVER_ADDR)")
	cmd.Flags().StringVar(&up, "upstream", "", "upstream base URL, without /v1 (env IMGCTX_UPSTREAM_BASE_URL)")
	cmd.Flags().StringVar(&format, "upstream-format", "", "openai, anthropic, gemini, llamacpp or ollama (env IMGCTX_UPSTREAM_FORMAT; the sessions API needs openai or anthropic)")
	return cmd
}

// engineConfig is the engine's part of the configuration: serve and
// simulate run the same engine.
func engineConfig(cfg config.Config) engine.Config {
	return engine.Config{Keep: policy.KeepConfig{BudgetFraction: cfg.Keep.BudgetFraction, Hold: cfg.Keep.Hold, Sight: cfg.Keep.Sight, HourCache: cfg.Keep.HourCache},
		Compact: cfg.CompactConfig(), CompactThreshold: cfg.Compaction.Threshold, Micro: cfg.MicroConfig(),
		Limits:                 cfg.MediaLimits(),
		ShrinkPixelsPerRequest: cfg.Media.ShrinkPerRequest, ShrinkMemory: cfg.Media.ShrinkMemory, ShrinkWait: cfg.Media.ShrinkWait,
		KeepLowWater: cfg.Keep.LowWater, CacheTTL: cfg.Keep.CacheTTL, ProxyMaxImages: cfg.Proxy.MaxImages, ProxyRelief: cfg.Proxy.WindowRelief, ProxyClientWindow: cfg.Proxy.ClientWindow, Replay: cfg.ReplayConfig()}
}

// buildServer wires the gateway from the config: the one place where serve
// chooses its backends.
func (a *app) buildServer(ctx context.Context) (*gateway.Server, func(), error) {
	cfg := a.cfg
	images, _, err := a.openStore(ctx)
	if err != nil {
		return nil, nil, err
	}
	sessions, err := a.openSessions(ctx)
	if err != nil {
		return nil, nil, err
	}
	profiles, err := cfg.ProfileTable()
	if err != nil {
		sessions.Close()
		return nil, nil, err
	}
	keys, _ := cfg.APIKeys()
	tenantKeys, _ := cfg.TenantUpstreamKeys()
	routes := routingTable(cfg)
	e := &engine.Engine{
		Config:   engineConfig(cfg),
		Images:   images,
		Sessions: sessions,
		Profiles: profiles,
		Upstream: newClient(cfg, cfg.Upstream.Format, cfg.Upstream.BaseURL, cfg.Upstream.APIKey),
		Fetcher: &media.Fetcher{MaxBytes: cfg.Media.Fetch.MaxBytes, Timeout: cfg.Media.Fetch.Timeout,
			MaxRedirects: cfg.Media.Fetch.MaxRedirects, AllowLoopback: cfg.Media.Fetch.AllowLoopback, AnyPort: cfg.Media.Fetch.AllowLoopback, Log: a.log},
		Shrinker: &media.Shrinker{Limits: cfg.MediaLimits()},
		Log:      a.log,
	}
	e.Hints = hints(cfg.Upstream.Vision, cfg.Upstream.ContextWindow)
	e.UpstreamFiles = cfg.Upstream.FileIDs == "auto"
	if cfg.Upstream.BaseURL == "" {
		// The sessions API runs on the first listed upstream it can speak to.
		for _, r := range routes {
			if engine.SpeaksSessions(r.Client.Format) {
				e.Upstream, e.Hints, e.UpstreamFiles = r.Client, r.Hints, r.Files
				break
			}
		}
	}
	tp, stopTrace, err := tracerProvider(ctx, cfg.Trace)
	if err != nil {
		sessions.Close()
		return nil, nil, err
	}
	var tracer trace.TracerProvider
	if tp != nil {
		tracer = tp
		a.log.Info("tracing", "endpoint", endpointShown(cfg.Trace.Endpoint), "sample_ratio", cfg.Trace.SampleRatio)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	srv := gateway.New(gateway.Config{Keys: keys, PassClientKey: cfg.Auth.PassClientKey, MaxBodyBytes: cfg.Server.MaxBodyBytes,
		MaxConcurrent: cfg.Server.MaxConcurrent, RequestTimeout: cfg.Server.RequestTimeout,
		UpstreamKeys: tenantKeys, Upstreams: routes, MaxResponseBytes: cfg.Upstream.MaxResponse,
		MaxMessages: cfg.Server.MaxMessages, MaxParts: cfg.Server.MaxParts, MaxConcurrentPerTenant: cfg.Server.MaxPerTenant,
		MaxInflightBytes: cfg.Server.MaxInflight, BodyTimeout: cfg.Server.BodyTimeout, MinBodyRate: cfg.Server.MinBodyRate,
		ProxyKeepOff: !cfg.Proxy.KeepTurnImages, Recall: cfg.Proxy.Recall, Version: version,
		RequestLog: cfg.RequestLog.Enabled, RequestRetention: cfg.RequestLog.Retention, RequestMaxRows: cfg.RequestLog.MaxRows,
		Tracer: tracer, UI: cfg.UI.Enabled, UIAdminKey: cfg.UI.AdminKey}, e, reg, a.log)
	stopExpiry := expireProxied(sessions, cfg.Proxy.IdleExpiry, a.log, func(ctx context.Context) {
		if n, left, err := e.SweepFiles(ctx, cfg.Proxy.IdleExpiry, srv.Routes()); err != nil && ctx.Err() == nil {
			a.log.Error("deleting provider files no conversation uses", "err", err)
		} else if n > 0 || left > 0 {
			a.log.Info("deleted provider files no conversation uses", "count", n, "left", left, "idle_expiry", cfg.Proxy.IdleExpiry)
		}
	})
	stopFlush := every(time.Second, func() {
		if err := e.FlushProxied(context.Background()); err != nil {
			a.log.Error("writing proxied conversations' measurement bases", "err", err)
		}
	})
	return srv, func() { stopExpiry(); stopFlush(); srv.Close(); stopTrace(); sessions.Close() }, nil
}

// expireProxied deletes the decisions of proxied conversations idle past
// the expiry, at start and then every tenth of it (at most hourly), so
// client input cannot grow the database without end, and sweeps the
// provider files they no longer use. It returns a stop, which cancels the
// pass under way and returns once it has ended: the store it uses is
// closed after it, and nothing is logged after serve returns.
func expireProxied(s session.Store, idle time.Duration, log *slog.Logger, sweep func(context.Context)) func() {
	ctx, cancel := context.WithCancel(context.Background())
	finished := make(chan struct{})
	every := max(min(idle/10, time.Hour), time.Millisecond)
	go func() {
		defer close(finished)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if n, err := s.ExpireProxied(ctx, time.Now().Add(-idle)); err != nil && ctx.Err() == nil {
				log.Error("expiring idle proxied conversations", "err", err)
			} else if n > 0 {
				log.Info("expired idle proxied conversations", "count", n, "idle_expiry", idle)
			}
			sweep(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-finished }
}

// every runs fn each period until stopped; the stop runs it a last time.
func every(period time.Duration, fn func()) (stop func()) {
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-done:
				fn()
				return
			case <-t.C:
				fn()
			}
		}
	}()
	return func() { close(done); <-finished }
}

// upstreamTransport keeps connections to the upstreams open for as many
// requests as the gateway serves at once (the default keeps two per host,
// so concurrent clients would open and close connections all the time),
// and writes request bodies in large pieces.
func upstreamTransport(cfg config.Config) *http.Transport {
	t := upstream.NewTransport()
	t.MaxIdleConns = 4 * cfg.Server.MaxConcurrent
	t.MaxIdleConnsPerHost = cfg.Server.MaxConcurrent
	t.WriteBufferSize, t.ReadBufferSize = 64<<10, 64<<10
	return t
}

func newClient(cfg config.Config, format, baseURL, key string) *upstream.Client {
	c := &upstream.Client{Format: upstream.Format(format), BaseURL: baseURL, APIKey: key,
		HTTP: &http.Client{Timeout: cfg.Upstream.Timeout, Transport: upstreamTransport(cfg)}, MaxRetries: cfg.Upstream.MaxRetries}
	if cfg.Upstream.MaxRetries == 0 {
		c.MaxRetries = -1
	}
	return c
}

func hints(vision string, window int) engine.Hints {
	h := engine.Hints{ContextWindow: window}
	if vision == "true" || vision == "false" {
		v := vision == "true"
		h.Vision = &v
	}
	return h
}

// routingTable is the drop-in routes' upstreams: the upstreams list in
// order, then upstream.base_url when set. Empty when only upstream.* is
// configured (the gateway then routes everything to the engine's).
func routingTable(cfg config.Config) []*gateway.Upstream {
	if len(cfg.Upstreams) == 0 {
		return nil
	}
	var out []*gateway.Upstream
	for _, r := range cfg.Upstreams {
		out = append(out, &gateway.Upstream{Name: r.Name, Client: newClient(cfg, r.Format, r.BaseURL, r.APIKey),
			Models: r.Models, Hints: hints(r.Vision, r.ContextWindow), Files: r.FileIDs == "auto"})
	}
	if cfg.Upstream.BaseURL != "" {
		out = append(out, &gateway.Upstream{Name: "default", Client: newClient(cfg, cfg.Upstream.Format, cfg.Upstream.BaseURL, cfg.Upstream.APIKey),
			Hints: hints(cfg.Upstream.Vision, cfg.Upstream.ContextWindow), Files: cfg.Upstream.FileIDs == "auto"})
	}
	return out
}

// redact hides a password in a URL before it is logged.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		return raw
	}
	return u.Redacted()
}

// serve listens until ctx ends, then shuts down gracefully: requests in
// flight finish (within server.shutdown_timeout), nothing is half written.
func (a *app) serve(ctx context.Context) error {
	// A line a request: the server's log is written in batches (bufferedLog),
	// closed last so that the shutdown's lines are in it.
	out := newBufferedLog(a.stderr, logFlushEvery)
	defer out.Close()
	a.log = slog.New(flushing{newLogger(out, a.cfg.Log).Handler(), out})
	srv, closeAll, err := a.buildServer(ctx)
	if err != nil {
		return err
	}
	defer closeAll()
	ln, err := net.Listen("tcp", a.cfg.Server.Addr)
	if err != nil {
		return fmt.Errorf("listen: %w (is another imgctx or program on %s? choose another with --addr)", err, a.cfg.Server.Addr)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	upstreamURL := a.cfg.Upstream.BaseURL
	upstreamURL = redact(upstreamURL)
	for _, r := range a.cfg.Upstreams {
		upstreamURL += " " + r.Name + "=" + redact(r.BaseURL) + " (" + r.Format + ")"
	}
	if upstreamURL == "" {
		upstreamURL = "(none: set --upstream or IMGCTX_UPSTREAM_BASE_URL; proxied requests answer 502)"
	}
	a.log.Info("imgctx serving", "addr", ln.Addr().String(), "data_dir", a.cfg.DataDir,
		"upstream", upstreamURL, "format", a.cfg.Upstream.Format, "auth", a.cfg.Auth.Keys != "",
		"sessions", a.cfg.Storage.Sessions, "images", a.cfg.Storage.Images) // backends by name: their DSN and secret stay out
	// The signals are ours before anyone can know the address to send them.
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(signals)
	fmt.Fprintf(a.stdout, "imgctx listening on http://%s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	for stopping := false; !stopping; {
		select {
		case err := <-errc:
			return err
		case <-ctx.Done():
			stopping = true
		case sig := <-signals:
			switch sig {
			case syscall.SIGHUP:
				a.log.Info("SIGHUP ignored: the config is read at start; restart imgctx serve to apply a change")
			case syscall.SIGTERM:
				// Readiness fails first, while requests are still served, so
				// that a load balancer stops sending new ones.
				srv.Drain()
				a.log.Info("draining", "delay", a.cfg.Server.DrainDelay.String())
				select {
				case <-time.After(a.cfg.Server.DrainDelay):
				case err := <-errc:
					return err
				}
				stopping = true
			default: // SIGINT: at once
				stopping = true
			}
		}
	}
	a.log.Info("shutting down", "grace", a.cfg.Server.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), a.cfg.Server.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
