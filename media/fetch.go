package media

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"code.dny.dev/ssrf"
	"github.com/imgctx/imgctx/reason"
)

// Fetcher downloads images by URL without letting a URL reach inside the
// network. The resolved address of every connection, redirects included, is
// checked at dial time, after DNS, so a name that resolves to a private
// address or a redirect to one is refused before any packet is sent:
// loopback, private ranges, link-local (cloud metadata), IPv4-mapped IPv6 and
// the other special-purpose ranges are all refused.
//
// The zero value is ready to use with the defaults below. Safe for
// concurrent use; do not change fields after the first Fetch.
type Fetcher struct {
	MaxBytes     int64         // body size cap; default 10 MB
	Timeout      time.Duration // whole fetch; default 10 s
	MaxRedirects int           // default 3; negative means none
	// AllowLoopback lets 127.0.0.0/8 and ::1 through. Only tests and local
	// development should set it.
	AllowLoopback bool
	// AnyPort lifts the default restriction to ports 80 and 443.
	AnyPort bool
	// Resolver resolves names; nil means the system resolver.
	Resolver *net.Resolver
	// Log gets the details of a failed fetch (resolved addresses, the
	// resolver's own); the error a client sees names only the reason and
	// its URL. nil: slog.Default().
	Log *slog.Logger

	once   sync.Once
	client *http.Client
	guard  *ssrf.Guardian
}

// Defaults of Fetcher.
const (
	DefaultFetchTimeout  = 10 * time.Second
	DefaultMaxRedirects  = 3
	defaultMaxFetchBytes = DefaultMaxBytes
)

func (f *Fetcher) init() {
	var opts []ssrf.Option
	if f.AllowLoopback {
		opts = append(opts,
			ssrf.WithAllowedV4Prefixes(netip.MustParsePrefix("127.0.0.0/8")),
			ssrf.WithAllowedV6Prefixes(netip.MustParsePrefix("::1/128")))
	}
	if f.AnyPort {
		opts = append(opts, ssrf.WithAnyPort())
	}
	f.guard = ssrf.New(opts...)
	dialer := &net.Dialer{Timeout: 5 * time.Second, Control: f.guard.Safe, Resolver: f.Resolver}
	tr := &http.Transport{
		Proxy:                  nil, // a proxy would dial on our behalf, past the guard
		DialContext:            dialer.DialContext,
		TLSHandshakeTimeout:    5 * time.Second,
		ResponseHeaderTimeout:  f.timeout(),
		MaxResponseHeaderBytes: 64 << 10,
		MaxIdleConns:           16,
		IdleConnTimeout:        30 * time.Second,
		ForceAttemptHTTP2:      true,
	}
	maxRedirects := f.MaxRedirects
	if maxRedirects == 0 {
		maxRedirects = DefaultMaxRedirects
	}
	f.client = &http.Client{
		Transport: tr,
		Timeout:   f.timeout(),
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) > maxRedirects {
				return refusal(fmt.Sprintf("more than %d redirects", max(maxRedirects, 0)))
			}
			return checkURL(req.URL)
		},
	}
}

func (f *Fetcher) timeout() time.Duration {
	if f.Timeout > 0 {
		return f.Timeout
	}
	return DefaultFetchTimeout
}

func (f *Fetcher) maxBytes() int64 {
	if f.MaxBytes > 0 {
		return f.MaxBytes
	}
	return defaultMaxFetchBytes
}

// refusal is a URL the fetcher's own rules refuse: its text is safe to show.
type refusal string

func (r refusal) Error() string { return string(r) }

func checkURL(u *url.URL) error {
	if u.Scheme != "http" && u.Scheme != "https" {
		return refusal(fmt.Sprintf("scheme %q not allowed (http and https only)", u.Scheme))
	}
	if u.User != nil {
		return refusal("credentials in URLs are not allowed")
	}
	if u.Hostname() == "" {
		return refusal("URL has no host")
	}
	if numericHost(u.Hostname()) {
		// 0x7f.1, 0177.0.0.1, 2130706433: addresses in the forms C's
		// inet_aton reads, which a system resolver may turn into
		// 127.0.0.1 — refused before any lookup, not sent to one.
		return refusal("a numeric host not written as a dotted-quad or IPv6 address")
	}
	return nil
}

// numericHost reports whether host is an IPv4 address in one of inet_aton's
// other forms: one to four parts, each decimal, octal (leading 0) or hex
// (0x), not the standard dotted quad.
func numericHost(host string) bool {
	if _, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return false // standard forms are checked as addresses
	}
	parts := strings.Split(strings.TrimSuffix(host, "."), ".")
	if len(parts) > 4 {
		return false
	}
	for _, p := range parts {
		digits, hex := p, false
		if len(p) > 2 && (p[:2] == "0x" || p[:2] == "0X") {
			digits, hex = p[2:], true
		}
		if digits == "" {
			return false
		}
		for _, c := range strings.ToLower(digits) {
			if !('0' <= c && c <= '9' || hex && 'a' <= c && c <= 'f') {
				return false
			}
		}
	}
	return true
}

// Fetched is a downloaded body and its declared content type.
type Fetched struct {
	Data        []byte
	ContentType string // as the server declared it; sniff before trusting
	FinalURL    string // after redirects
}

// Fetch downloads rawURL. Refusals carry reason fetch_failed, or too_large
// when the body passes MaxBytes (checked on the decompressed stream, whatever
// Content-Length said).
func (f *Fetcher) Fetch(ctx context.Context, rawURL string) (Fetched, error) {
	f.once.Do(f.init)
	u, err := url.Parse(strings.TrimSpace(rawURL))
	if err != nil {
		return Fetched{}, reason.Wrap(reason.FetchFailed, "unparsable URL", err)
	}
	if err := checkURL(u); err != nil {
		return Fetched{}, reason.Wrap(reason.FetchFailed, "refused URL", err)
	}
	// A literal address is checked now for a clear message; names are
	// checked at dial time, after resolution.
	if ip, err := netip.ParseAddr(strings.Trim(u.Hostname(), "[]")); err == nil {
		if err := f.guard.SafeAddr(ip); err != nil {
			return Fetched{}, reason.New(reason.FetchFailed, "address not allowed: "+u.Redacted())
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return Fetched{}, reason.Wrap(reason.FetchFailed, "bad request", err)
	}
	req.Header.Set("Accept", "image/png, image/jpeg, image/gif, image/webp, application/pdf;q=0.8")
	req.Header.Set("User-Agent", "imgctx-fetch/1")
	resp, err := f.client.Do(req)
	if err != nil {
		// The transport's error names the addresses a name resolved to
		// and the resolver's own: the log gets them, the client does not.
		log := f.Log
		if log == nil {
			log = slog.Default()
		}
		log.Warn("image fetch failed", "url", u.Redacted(), "error", err)
		var ours refusal
		switch {
		case errors.As(err, &ours):
			return Fetched{}, reason.Wrap(reason.FetchFailed, "refused URL "+u.Redacted(), ours)
		case errors.Is(err, ssrf.ErrProhibitedIP) || errors.Is(err, ssrf.ErrProhibitedPort) || errors.Is(err, ssrf.ErrProhibitedNetwork):
			return Fetched{}, reason.New(reason.FetchFailed, "address not allowed: "+u.Redacted())
		case errors.Is(err, context.DeadlineExceeded) || os.IsTimeout(err):
			return Fetched{}, reason.New(reason.FetchFailed, fmt.Sprintf("no answer within %s: %s", f.timeout(), u.Redacted()))
		}
		return Fetched{}, reason.New(reason.FetchFailed, "could not fetch "+u.Redacted())
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Fetched{}, reason.New(reason.FetchFailed, "upstream answered "+resp.Status)
	}
	limit := f.maxBytes()
	if resp.ContentLength > limit {
		return Fetched{}, reason.New(reason.TooLarge, fmt.Sprintf("body of %d bytes is over the limit of %d bytes", resp.ContentLength, limit))
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return Fetched{}, reason.Wrap(reason.FetchFailed, "reading body", err)
	}
	if int64(len(data)) > limit {
		return Fetched{}, reason.New(reason.TooLarge, fmt.Sprintf("body is over the limit of %d bytes", limit))
	}
	return Fetched{Data: data, ContentType: resp.Header.Get("Content-Type"), FinalURL: resp.Request.URL.String()}, nil
}
