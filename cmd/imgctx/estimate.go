package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/tokens"
	"github.com/spf13/cobra"
)

// representatives are the models estimate prices an image for when no
// --model is given: one per provider family and rule.
var representatives = []string{
	"gpt-4o", "gpt-5.4", "claude-sonnet-4-6", "claude-opus-4-7",
	"gemini-2.5-flash", "gemini-3-pro-preview", "qwen2.5-vl-72b-instruct", "qwen3-vl-235b-a22b",
}

type estimateRow struct {
	Model   string `json:"model"`
	Profile string `json:"profile"`
	Tokens  int    `json:"tokens,omitempty"`
	Width   int    `json:"width,omitempty"`
	Height  int    `json:"height,omitempty"`
	Error   string `json:"error,omitempty"`
}

type estimateResult struct {
	File      string        `json:"file"`
	Ref       string        `json:"ref,omitempty"`
	MediaType string        `json:"media_type,omitempty"`
	Kind      string        `json:"kind,omitempty"`
	Bytes     int64         `json:"bytes,omitempty"`
	Width     int           `json:"width,omitempty"`
	Height    int           `json:"height,omitempty"`
	Estimates []estimateRow `json:"estimates,omitempty"`
	Note      string        `json:"note,omitempty"`
	Error     string        `json:"error,omitempty"`
	Reason    string        `json:"reason,omitempty"`
}

func newEstimateCmd(a *app) *cobra.Command {
	var model, detail string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "estimate FILE...",
		Short: "Show what images cost: format, size, ref, and tokens per model",
		Long: "estimate reads each image's header (never decoding its pixels) and prices it with the\n" +
			"provider's documented rule: for --model, or for one representative model of each family.\n" +
			"A FILE may also hold an image as a base64 data URL or bare base64 text: only the base64 of\n" +
			"its header is decoded.",
		Example: "  imgctx estimate testdata/screenshot.png\n  imgctx estimate shot.png --model claude-opus-4-7 --json",
		Args:    minArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			tbl, err := a.cfg.ProfileTable()
			if err != nil {
				return err
			}
			if known := details(tbl); detail != "" && !slices.Contains(known, detail) {
				return usageError{fmt.Errorf("--detail %q is not a detail level any profile knows; use one of %s", detail, strings.Join(known, ", "))}
			}
			models := representatives
			if model != "" {
				models = []string{model}
			}
			var results []estimateResult
			failed := 0
			for _, f := range args {
				r := estimateFile(f, models, detail, tbl, a)
				if r.Error != "" {
					failed++
				}
				results = append(results, r)
			}
			if asJSON {
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(results); err != nil {
					return err
				}
			} else {
				printEstimates(a.stdout, a.stderr, results)
			}
			if failed > 0 {
				return fmt.Errorf("%d of %d file(s) refused", failed, len(args))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&model, "model", "", "price for this model only (any name; unknown models get the conservative default profile)")
	cmd.Flags().StringVar(&detail, "detail", "", "provider detail level: low, high, original, auto, or a Gemini media_resolution")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func estimateFile(path string, models []string, detail string, tbl *tokens.Table, a *app) estimateResult {
	r := estimateResult{File: path}
	fail := func(err error) estimateResult {
		r.Error, r.Reason = err.Error(), string(reason.Of(err))
		if r.Reason == "" {
			r.Reason = "unreadable" // the file itself: missing, a directory, no permission
		}
		return r
	}
	data, err := readCapped(path, a.cfg.Media.MaxImageBytes)
	if err != nil {
		return fail(err)
	}
	in, err := media.Inspect(data, "", a.cfg.MediaLimits())
	if b64, ok := base64Text(data); ok && errors.Is(err, media.ErrUnsupported) {
		// A data URL or bare base64 (an agent's log, a request body's
		// field): read from its header, never decoded whole.
		mt, w, h, herr := media.HeaderFromBase64(b64, a.cfg.MediaLimits())
		if herr != nil {
			return fail(herr)
		}
		in, err = media.Info{MediaType: mt, Kind: media.KindImage, Bytes: int64(len(b64)) * 3 / 4, Width: w, Height: h}, nil
		r.Note = "read from its base64 header; bytes approximate, no ref (the bytes were not decoded)"
	}
	if err != nil {
		return fail(err)
	}
	r.MediaType, r.Kind, r.Bytes, r.Width, r.Height = in.MediaType, string(in.Kind), in.Bytes, in.Width, in.Height
	if in.Ref.Valid() {
		r.Ref = in.Ref.String()
	}
	for _, m := range models {
		if in.Kind == media.KindDocument {
			// A PDF travels natively: priced by its pages.
			p := tbl.Resolve(m, a.log)
			r.Estimates = append(r.Estimates, estimateRow{Model: m, Profile: p.Name, Tokens: tokens.DocumentTokens(p, in.Pages)})
			r.Note = fmt.Sprintf("%d page(s), priced per page", in.Pages)
			continue
		}
		p := tbl.Resolve(m, a.log)
		row := estimateRow{Model: m, Profile: p.Name}
		if e, err := tokens.EstimateImage(p, in.Width, in.Height, detail); err != nil {
			row.Error = err.Error()
		} else {
			row.Tokens, row.Width, row.Height = e.Tokens, e.Width, e.Height
		}
		r.Estimates = append(r.Estimates, row)
	}
	return r
}

// base64Text is a file's text when it is a base64 data URL or bare
// standard base64 (whitespace around it allowed): the characters after
// the comma, or all of them.
func base64Text(data []byte) (string, bool) {
	s := strings.TrimSpace(string(data))
	if len(s) >= 5 && strings.EqualFold(s[:5], "data:") {
		_, b64, ok := strings.Cut(s, ";base64,")
		return b64, ok && b64 != ""
	}
	if len(s) < 16 {
		return "", false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/' || c == '=' || c == '-' || c == '_') {
			return "", false
		}
	}
	return s, true
}

// readCapped reads a file, refusing one over max bytes without reading it.
func readCapped(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		return nil, reason.New(reason.TooLarge, fmt.Sprintf("%s is %d bytes, over the limit of %d bytes", path, fi.Size(), max))
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, reason.New(reason.TooLarge, fmt.Sprintf("%s is over the limit of %d bytes", path, max))
	}
	return data, nil
}

// details lists the detail levels the profiles know, sorted.
func details(tbl *tokens.Table) []string {
	set := map[string]bool{"auto": true, "low": true, "high": true}
	for _, p := range append(tbl.Profiles, tbl.Default) {
		for k := range p.Image.Levels {
			set[k] = true
		}
		for k := range p.Image.Resolutions {
			set[k] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// printEstimates writes the results to w, and refusals to errw (as store
// does).
func printEstimates(w, errw io.Writer, results []estimateResult) {
	for i, r := range results {
		if r.Error != "" {
			fmt.Fprintf(errw, "%s: refused (%s): %s\n", r.File, r.Reason, r.Error)
			continue
		}
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s  %s  %d bytes", r.File, r.MediaType, r.Bytes)
		if r.Width > 0 {
			fmt.Fprintf(w, "  %d×%d", r.Width, r.Height)
		}
		fmt.Fprintf(w, "\n  ref %s\n", r.Ref)
		if r.Note != "" {
			fmt.Fprintf(w, "  %s\n", r.Note)
			continue
		}
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  MODEL\tPROFILE\tTOKENS\tSEEN AS")
		for _, e := range r.Estimates {
			if e.Error != "" {
				fmt.Fprintf(tw, "  %s\t%s\t-\t%s\n", e.Model, e.Profile, e.Error)
				continue
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%d×%d\n", e.Model, e.Profile, e.Tokens, e.Width, e.Height)
		}
		tw.Flush()
	}
}
