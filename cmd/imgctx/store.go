package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/media"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

func newStoreCmd(a *app) *cobra.Command {
	var tenant string
	var keyFile string
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Manage the image store: put, get, stat, verify, gc",
		Long: "The image store keeps each image once, by the SHA-256 of its bytes, under\n" +
			"<data-dir>/images, or in the S3 bucket storage.s3.* names when storage.images is s3 (docs/format.md).\n" +
			"With --encrypt-key-file every blob is sealed with AES-256-GCM. gc keeps what the sessions of the\n" +
			"configured session store (SQLite or PostgreSQL) still use.",
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("encrypt-key-file") {
				a.flagOverrides["store.encrypt_key_file"] = keyFile
			}
			return cmd.Root().PersistentPreRunE(cmd, args)
		},
		// A word that names no subcommand is a wrong command line (exit
		// 2), not a request for help: cobra would print the help and exit 0.
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			return usageError{fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())}
		},
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&tenant, "tenant", imagestore.DefaultTenant, "tenant whose images to use")
	pf.StringVar(&keyFile, "encrypt-key-file", "", "master key file (env IMGCTX_STORE_ENCRYPT_KEY_FILE)")
	cmd.AddCommand(
		newStorePutCmd(a, &tenant), newStoreGetCmd(a, &tenant), newStoreStatCmd(a, &tenant),
		newStoreVerifyCmd(a, &tenant), newStoreGCCmd(a, &tenant),
	)
	return cmd
}

func newStorePutCmd(a *app, tenant *string) *cobra.Command {
	return &cobra.Command{
		Use:   "put FILE...",
		Short: "Store images; print each one's ref",
		Long:  "put checks each file (format, size, pixel count from the header) and stores it once.\nA refused file stores nothing.",
		Args:  minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, _, err := a.openStore(cmd.Context())
			if err != nil {
				return err
			}
			failed := 0
			for _, path := range args {
				data, err := readCapped(path, a.cfg.Media.MaxImageBytes)
				if err == nil {
					var in media.Info
					in, err = media.Inspect(data, "", a.cfg.MediaLimits())
					if err == nil {
						err = s.Put(cmd.Context(), *tenant, in.Ref, data)
					}
					if err == nil {
						fmt.Fprintf(a.stdout, "%s  %s  %s  %d bytes\n", in.Ref, path, in.MediaType, in.Bytes)
						continue
					}
				}
				failed++
				fmt.Fprintf(a.stderr, "%s: refused: %v\n", path, err)
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d file(s) refused; nothing stored for them", failed, len(args))
			}
			return nil
		},
	}
}

// refAndStore parses a ref argument (a bad one is a usage error) and opens
// the store.
func (a *app) refAndStore(ctx context.Context, arg string) (blob.Ref, imagestore.Store, error) {
	ref, err := blob.Parse(arg)
	if err != nil {
		return blob.Ref{}, nil, usageError{err}
	}
	s, _, err := a.openExistingStore(ctx)
	return ref, s, err
}

func newStoreGetCmd(a *app, tenant *string) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "get REF",
		Short: "Write an image's bytes to a file or standard output",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				if f, ok := a.stdout.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
					return usageError{fmt.Errorf("refusing to write image bytes to a terminal: use -o FILE or redirect")}
				}
			}
			ref, s, err := a.refAndStore(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			data, err := s.Get(cmd.Context(), *tenant, ref)
			if err != nil {
				return err
			}
			if out != "" {
				return os.WriteFile(out, data, 0o644)
			}
			_, err = a.stdout.Write(data)
			return err
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "write to this file instead of standard output")
	return cmd
}

func newStoreStatCmd(a *app, tenant *string) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stat REF",
		Short: "Show an image's size and last use",
		Args:  exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, s, err := a.refAndStore(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			in, err := s.Stat(cmd.Context(), *tenant, ref)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(map[string]any{
					"ref": in.Ref, "tenant": *tenant, "bytes": in.Size, "modified": in.ModTime.UTC().Format(time.RFC3339)})
			}
			fmt.Fprintf(a.stdout, "%s  tenant %s  %d bytes  last used %s\n", in.Ref, *tenant, in.Size, in.ModTime.UTC().Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// tenantsFor returns the tenant given with --tenant, or every tenant of the
// store when the flag was not set.
func tenantsFor(cmd *cobra.Command, b imageBackend, tenant string) ([]string, error) {
	if cmd.Flags().Changed("tenant") {
		return []string{tenant}, nil
	}
	return b.tenants(cmd.Context())
}

func newStoreVerifyCmd(a *app, tenant *string) *cobra.Command {
	return &cobra.Command{
		Use:   "verify",
		Short: "Read back every image and check it (all tenants unless --tenant)",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, backend, err := a.openExistingStore(cmd.Context())
			if err != nil {
				return err
			}
			tenants, err := tenantsFor(cmd, backend, *tenant)
			if err != nil {
				return err
			}
			var raw imagestore.Store
			if a.cfg.Store.EncryptKeyFile == "" {
				raw = backend.raw // without a key, tell sealed blobs from corrupt ones
			}
			p := newProgress(a.stderr)
			checked, corrupt, sealed := 0, 0, 0
			for _, t := range tenants {
				st, err := imagestore.Verify(cmd.Context(), s, t, raw, func(st imagestore.VerifyStats) {
					p.update("verify %s: %d checked, %d corrupt", t, st.Checked, len(st.Corrupt))
				})
				p.done()
				if err != nil {
					return err
				}
				for _, r := range st.Corrupt {
					fmt.Fprintf(a.stdout, "corrupt  %s  tenant %s\n", r, t)
				}
				for _, r := range st.Sealed {
					fmt.Fprintf(a.stdout, "sealed   %s  tenant %s  (encrypted; not readable with the key given)\n", r, t)
				}
				checked += st.Checked
				corrupt += len(st.Corrupt)
				sealed += len(st.Sealed)
			}
			fmt.Fprintf(a.stdout, "verified %d image(s) in %d tenant(s): %d corrupt, %d sealed with a key not given\n", checked, len(tenants), corrupt, sealed)
			switch {
			case corrupt > 0:
				return fmt.Errorf("%d corrupt image(s): %w", corrupt, imagestore.ErrCorrupt)
			case sealed > 0:
				return fmt.Errorf("%d image(s) are encrypted at rest and could not be opened: %w", sealed, imagestore.ErrUnknownKey)
			}
			return nil
		},
	}
}

func newStoreGCCmd(a *app, tenant *string) *cobra.Command {
	var olderThan time.Duration
	cmd := &cobra.Command{
		Use:   "gc",
		Short: "Delete images not used for a while (all tenants unless --tenant)",
		Long:  "gc deletes images not put or touched within --older-than, and temp files left by interrupted writes.",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan <= 0 {
				return usageError{fmt.Errorf("--older-than must be positive")}
			}
			s, backend, err := a.openExistingStore(cmd.Context())
			if err != nil {
				return err
			}
			tenants, err := tenantsFor(cmd, backend, *tenant)
			if err != nil {
				return err
			}
			// A live proxied conversation holds no list of its images, but
			// touches each one it re-sends: none of them is older than the
			// conversation's idle expiry (plus the touch interval). While
			// one is live, gc deletes nothing younger than that.
			if reach := a.cfg.Proxy.IdleExpiry + engine.TouchEvery; olderThan < reach {
				live, err := a.liveProxied(cmd.Context())
				if err != nil {
					return err
				}
				if live > 0 {
					fmt.Fprintf(a.stderr, "gc: %d proxied conversation(s) are live (proxy.idle_expiry %s): deleting only images untouched for %s, not %s\n",
						live, a.cfg.Proxy.IdleExpiry, reach, olderThan)
					olderThan = reach
				}
			}
			cutoff := time.Now().Add(-olderThan)
			p := newProgress(a.stderr)
			var total imagestore.GCStats
			for _, t := range tenants {
				keep, err := a.referenced(cmd.Context(), t)
				if err != nil {
					return err
				}
				st, err := imagestore.GC(cmd.Context(), s, t, cutoff, keep, func(st imagestore.GCStats) {
					p.update("gc %s: %d removed of %d scanned", t, st.Removed, st.Scanned)
				})
				p.done()
				if err != nil {
					return err
				}
				total.Scanned += st.Scanned
				total.Removed += st.Removed
				total.Freed += st.Freed
				total.Kept += st.Kept
			}
			temps, err := backend.sweep(time.Now().Add(-time.Hour))
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "gc: removed %d of %d image(s), freed %d bytes; kept %d still used by a session; removed %d stale temp file(s)\n",
				total.Removed, total.Scanned, total.Freed, total.Kept, temps)
			return a.sweepFiles(cmd.Context())
		},
	}
	cmd.Flags().DurationVar(&olderThan, "older-than", 30*24*time.Hour, "delete images not used for this long")
	return cmd
}

// referenced returns the refs a tenant's sessions still use in their live
// context, read from the session store when there is one. Images only
// proxied requests name (no session) are protected by their last use alone.
// liveProxied counts the proxied conversations within their idle expiry.
func (a *app) liveProxied(ctx context.Context) (int, error) {
	db, err := a.openExistingSessions(ctx)
	if err != nil || db == nil {
		return 0, err
	}
	defer db.Close()
	return db.ActiveProxied(ctx, time.Now().Add(-a.cfg.Proxy.IdleExpiry))
}

func (a *app) referenced(ctx context.Context, tenant string) (map[blob.Ref]bool, error) {
	db, err := a.openExistingSessions(ctx)
	if err != nil || db == nil {
		return nil, err
	}
	defer db.Close()
	metas, err := db.List(ctx, tenant)
	if err != nil {
		return nil, err
	}
	keep := map[blob.Ref]bool{}
	for _, m := range metas {
		snap, err := db.Load(ctx, tenant, m.ID)
		if err != nil {
			return nil, err
		}
		for _, msg := range snap.State.Live {
			chat.Walk(msg.Parts, func(p chat.Part, _ int) bool {
				switch p := p.(type) {
				case chat.Image:
					keep[p.Ref] = true
				case chat.Document:
					keep[p.Ref] = true
				}
				return true
			})
		}
	}
	return keep, nil
}

// sweepFiles deletes at their providers the files imgctx uploaded that no
// conversation used within proxy.idle_expiry, with the configured keys
// (a client's own key is never stored: its files are left to the server,
// which holds it while it runs, or to the provider's expiry).
func (a *app) sweepFiles(ctx context.Context) error {
	db, err := a.openExistingSessions(ctx)
	if err != nil || db == nil {
		return err
	}
	defer db.Close()
	routes := routingTable(a.cfg)
	if len(routes) == 0 && a.cfg.Upstream.BaseURL != "" {
		routes = []*engine.Route{{Name: "default", Client: newClient(a.cfg, a.cfg.Upstream.Format, a.cfg.Upstream.BaseURL, a.cfg.Upstream.APIKey)}}
	}
	tenantKeys, err := a.cfg.TenantUpstreamKeys()
	if err != nil {
		return err
	}
	var keys []string
	for _, k := range tenantKeys {
		keys = append(keys, k)
	}
	deleted, left, err := (&engine.Engine{Sessions: db}).SweepFiles(ctx, a.cfg.Proxy.IdleExpiry, routes, keys...)
	if err != nil {
		return fmt.Errorf("provider files: %w", err)
	}
	fmt.Fprintf(a.stdout, "gc: deleted %d provider file(s) no conversation used within proxy.idle_expiry (%s)", deleted, a.cfg.Proxy.IdleExpiry)
	if left > 0 {
		fmt.Fprintf(a.stdout, "; %d left: their credential is not configured here (the server deletes them with the client's key while it runs, or the provider expires them)", left)
	}
	fmt.Fprintln(a.stdout)
	return nil
}
