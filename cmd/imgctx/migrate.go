package main

import (
	"fmt"

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
			s, err := a.openSessions(cmd.Context())
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.Ping(cmd.Context()); err != nil {
				return fmt.Errorf("session store: %w", err)
			}
			fmt.Fprintf(a.stdout, "migrate: the %s session store is up to date\n", a.cfg.Storage.Sessions)
			return nil
		},
	}
}
