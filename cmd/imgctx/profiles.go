package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
)

func newProfilesCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "profiles",
		Short: "List the model profiles (embedded, plus the config file's)",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			tbl, err := a.cfg.ProfileTable()
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"version": tbl.Version, "doc_versions": tbl.DocVersions, "profiles": tbl.Profiles, "default": tbl.Default})
			}
			tw := tabwriter.NewWriter(a.stdout, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "PROFILE\tFAMILY\tWINDOW\tVISION\tIMAGE RULE\tMATCHES")
			for _, p := range append(tbl.Profiles, tbl.Default) {
				match := strings.Join(p.Match, " ")
				if p.Name == tbl.Default.Name {
					match = "(any other model)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%v\t%s\t%s\n", p.Name, p.Family, p.ContextWindow, p.Vision, p.Image.Rule, match)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, every parameter included")
	return cmd
}
