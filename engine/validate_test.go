package engine

import (
	"strings"
	"testing"

	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/upstream"
)

// Issue "Drop-in that survives agents changing", item 4: the library
// refuses what the config file refuses (a keep fraction of 1, a negative
// low-water mark), by name, on its first call; zero fields take defaults.
func TestConfigIsValidatedLikeTheConfigFile(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Fatalf("the zero config (every default): %v", err)
	}
	for _, c := range []struct {
		cfg  Config
		name string
	}{
		{Config{Keep: policy.KeepConfig{BudgetFraction: 1}}, "keep.budget_fraction"},
		{Config{Keep: policy.KeepConfig{BudgetFraction: -0.1}}, "keep.budget_fraction"},
		{Config{KeepLowWater: 1.5}, "keep.low_water"},
		{Config{CompactThreshold: -1}, "compaction.threshold"},
		{Config{ProxyRelief: 1.5}, "proxy.window_relief"},
		{Config{ProxyRelief: -0.5}, "proxy.window_relief"},
		{Config{ShrinkPixelsPerRequest: -5}, "media.shrink_max_pixels_per_request"},
	} {
		err := c.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.name) {
			t.Errorf("%+v: %v; want a refusal naming %s", c.cfg, err, c.name)
		}
	}
	r := newRig(t, upstream.OpenAI, 100_000)
	r.engine.Keep.BudgetFraction = 1
	id := r.session(t, true)
	if _, err := r.engine.Call(t.Context(), "default", id, user("hi")); err == nil || !strings.Contains(err.Error(), "keep.budget_fraction") {
		t.Fatalf("a call on an invalid engine: %v", err)
	}
	if _, err := r.engine.Proxy(t.Context(), ProxyCall{}); err == nil || !strings.Contains(err.Error(), "keep.budget_fraction") {
		t.Fatalf("a proxied request on an invalid engine: %v", err)
	}
}
