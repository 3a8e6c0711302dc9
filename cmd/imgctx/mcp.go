package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/recall"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"
)

func newMCPCmd(a *app) *cobra.Command {
	tenant := imagestore.DefaultTenant
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve the recall tools over MCP on stdin and stdout",
		Long: "mcp answers imgctx_recall and imgctx_list (docs/api.md \"Recall\") over stdio, for agents that launch\n" +
			"their tools as processes: it reads the stores of the data directory (or the configured PostgreSQL and\n" +
			"S3) that imgctx serve writes, as --tenant. imgctx serve offers the same tools at /mcp.",
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := imagestore.ValidTenant(tenant); err != nil {
				return usageError{err}
			}
			return a.mcp(cmd.Context(), tenant, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&tenant, "tenant", tenant, "the tenant whose images are recalled (its name in auth.keys)")
	return cmd
}

func (a *app) mcp(ctx context.Context, tenant string, in io.Reader, out io.Writer) error {
	images, _, err := a.openExistingStore(ctx)
	if err != nil {
		return err
	}
	sessions, err := a.openExistingSessions(ctx)
	if err != nil {
		return err
	}
	if sessions == nil {
		return fmt.Errorf("no session store in %s (check --data-dir): imgctx serve writes it", a.cfg.DataDir)
	}
	defer sessions.Close()
	profiles, err := a.cfg.ProfileTable()
	if err != nil {
		return err
	}
	e := &engine.Engine{Config: engineConfig(a.cfg), Images: images, Sessions: sessions, Profiles: profiles,
		Shrinker: &media.Shrinker{Limits: a.cfg.MediaLimits()}, Log: a.log}
	err = recall.NewServer(e, tenant, version).Run(ctx, &mcp.IOTransport{Reader: io.NopCloser(in), Writer: nopWriteCloser{out}})
	if errors.Is(err, io.EOF) || errors.Is(err, context.Canceled) {
		return nil // the agent closed our stdin: done
	}
	return err
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
