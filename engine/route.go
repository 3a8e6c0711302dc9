package engine

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
)

// Route is one model server of the drop-in routes: requests of its wire
// format whose model matches one of Models (path.Match patterns; none
// matches every model) go to it, first match wins.
type Route struct {
	Name   string
	Client *upstream.Client
	Models []string
	Hints  Hints
	// Files: images go to this upstream by file id where the client's
	// wire has a file form (upstreams[].file_ids auto).
	Files bool
}

// ErrNoUpstream: the gateway has no upstream at all.
var ErrNoUpstream = errors.New("no upstream configured: start imgctx serve with --upstream or IMGCTX_UPSTREAM_BASE_URL")

// NoRouteError: upstreams are configured, none serves the request.
type NoRouteError struct {
	Format     upstream.Format
	Model      string
	Configured []string // each route, with its format and models
}

func (e *NoRouteError) Error() string {
	return fmt.Sprintf("no upstream of this gateway serves %s requests for model %q; configured: %s", e.Format, e.Model, strings.Join(e.Configured, "; "))
}

// Serves reports whether the route takes a wire's requests for a model:
// its upstreams' format, or a flat backend for a wire whose whole request
// it can decode (chat, messages).
func (r *Route) Serves(d *wire.Dialect, model string) bool {
	if r.Client.Format != upstream.Format(d.Upstream) && !(r.Client.Format.Flat() && d.DecodeRequest != nil) {
		return false
	}
	if len(r.Models) == 0 {
		return true
	}
	for _, p := range r.Models {
		if ok, _ := path.Match(p, model); ok {
			return true
		}
	}
	return false
}

// Pick is the first route that serves a wire's requests for a model, or
// ErrNoUpstream, an invalid request (a wire a flat backend cannot take), or
// a *NoRouteError.
func Pick(routes []*Route, d *wire.Dialect, model string) (*Route, error) {
	if len(routes) == 0 {
		return nil, ErrNoUpstream
	}
	for _, r := range routes {
		if r.Serves(d, model) {
			return r, nil
		}
	}
	for _, r := range routes {
		if r.Client.Format.Flat() && d.DecodeRequest == nil {
			return nil, reason.New(reason.Invalid, fmt.Sprintf("upstream %s (%s) serves the chat and messages routes only", r.Name, r.Client.Format))
		}
	}
	var names []string
	for _, r := range routes {
		names = append(names, fmt.Sprintf("%s (%s, models %v)", r.Name, r.Client.Format, r.Models))
	}
	return nil, &NoRouteError{Format: upstream.Format(d.Upstream), Model: model, Configured: names}
}
