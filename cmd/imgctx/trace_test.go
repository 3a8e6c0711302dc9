package main

import (
	"strings"
	"testing"

	"github.com/imgctx/imgctx/internal/config"
)

// trace.endpoint: off when empty, refused with an example when it is not
// an http(s) URL, and the collector's traces path added when it has none.
func TestTraceEndpoint(t *testing.T) {
	tp, stop, err := tracerProvider(t.Context(), config.Trace{})
	if tp != nil || err != nil {
		t.Fatalf("empty endpoint: %v %v", tp, err)
	}
	stop()
	for _, bad := range []string{"127.0.0.1:4318", "ftp://collector/v1/traces", "http://"} {
		if _, _, err := tracerProvider(t.Context(), config.Trace{Endpoint: bad, SampleRatio: 1}); err == nil || !strings.Contains(err.Error(), "http://127.0.0.1:4318/v1/traces") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	tp, stop, err = tracerProvider(t.Context(), config.Trace{Endpoint: "http://user:secret@127.0.0.1:4318", SampleRatio: 1, ServiceName: "imgctx"})
	if err != nil || tp == nil {
		t.Fatal(err)
	}
	stop()
	if got := endpointShown("http://user:secret@127.0.0.1:4318/v1/traces"); strings.Contains(got, "secret") {
		t.Fatalf("the log would show the credentials: %s", got)
	}
}
