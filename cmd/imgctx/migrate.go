package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

func newMigrateCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "migrate",
		Short: "Apply the session store's schema migrations and exit",
		Long: "migrate opens the configured session store (storage.sessions), applies the migrations embedded in\n" +
			"this binary that it has not seen, and exits. serve does the same at start; run migrate first to\n" +
			"upgrade a shared PostgreSQL once before rolling out new replicas.",
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if a.cfg.Storage.Sessions == "sqlite" {
				if _, err := os.Stat(a.cfg.DataDir); errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("the data directory %s does not exist: create it, or set --data-dir (serve creates it at start)", a.cfg.DataDir)
				}
			}
			s, err := a.openSessions(cmd.Context())
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.Ping(cmd.Context()); err != nil {
				return fmt.Errorf("session store: %w", err)
			}
			if m, ok := s.(interface{ Migrated() []int }); ok && len(m.Migrated()) > 0 {
				fmt.Fprintf(a.stdout, "migrate: applied migrations %s to the %s session store; it is up to date\n", strings.Trim(strings.Join(strings.Fields(fmt.Sprint(m.Migrated())), ", "), "[]"), a.cfg.Storage.Sessions)
				return nil
			}
			fmt.Fprintf(a.stdout, "migrate: the %s session store is up to date (nothing to apply)\n", a.cfg.Storage.Sessions)
			return nil
		},
	}
}
