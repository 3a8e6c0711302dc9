package main

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/imgctx/imgctx/internal/config"
	"github.com/spf13/cobra"
)

// app holds what every subcommand shares: the loaded config and the writers.
type app struct {
	stdout, stderr io.Writer
	configPath     string
	flagOverrides  map[string]any
	cfg            config.Config
	log            *slog.Logger
}

func newRoot(stdout, stderr io.Writer) *cobra.Command {
	a := &app{stdout: stdout, stderr: stderr, flagOverrides: map[string]any{}}
	var dataDir, logLevel string
	root := &cobra.Command{
		Use:           "imgctx",
		Short:         "Image-aware context engine for LLM agents",
		Long:          "imgctx stores images once by reference, measures what they cost a model, and decides which images each request carries.",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if cmd.Flags().Changed("data-dir") {
				a.flagOverrides["data_dir"] = dataDir
			}
			if cmd.Flags().Changed("log-level") {
				a.flagOverrides["log.level"] = logLevel
			}
			cfg, err := config.Load(a.configPath, nil, a.flagOverrides)
			if err != nil {
				// A value given on the command line is a usage error (exit 2):
				// the same load without the flags succeeds.
				if len(a.flagOverrides) > 0 {
					if _, without := config.Load(a.configPath, nil, nil); without == nil {
						return usageError{err}
					}
				}
				return err
			}
			a.cfg = cfg
			a.log = newLogger(stderr, cfg.Log)
			return nil
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.configPath, "config", "", "YAML config file (docs/config.md)")
	pf.StringVar(&dataDir, "data-dir", "", "data directory (default ./imgctx-data; env IMGCTX_DATA_DIR)")
	pf.StringVar(&logLevel, "log-level", "", "debug, info, warn or error (env IMGCTX_LOG_LEVEL)")
	root.AddCommand(newServeCmd(a), newEstimateCmd(a), newStoreCmd(a), newProfilesCmd(a), newSimulateCmd(a), newMigrateCmd(a), newMCPCmd(a), newVersionCmd(a))
	return root
}

func newLogger(w io.Writer, c config.Log) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// exactArgs and minArgs report wrong argument counts as usage errors.
func exactArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageError{fmt.Errorf("%s takes %d argument(s), got %d", cmd.CommandPath(), n, len(args))}
		}
		return nil
	}
}

func minArgs(n int) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < n {
			return usageError{fmt.Errorf("%s needs at least %d argument(s)", cmd.CommandPath(), n)}
		}
		return nil
	}
}
