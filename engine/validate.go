package engine

import (
	"errors"
	"fmt"
)

// Validate checks the configuration as the config file's loader does: a
// zero field takes its default, and a value no default could mean is
// refused by name. Call and Proxy return its error until it is mended.
func (c Config) Validate() error {
	var errs []error
	fraction := func(name string, v float64) {
		if v < 0 || v >= 1 {
			errs = append(errs, fmt.Errorf("%s: must be between 0 and 1, or 0 for the default (got %v)", name, v))
		}
	}
	fraction("Keep.BudgetFraction (keep.budget_fraction)", c.Keep.BudgetFraction)
	fraction("KeepLowWater (keep.low_water)", c.KeepLowWater)
	fraction("Compact.PreserveFraction (compaction.preserve_fraction)", c.Compact.PreserveFraction)
	fraction("Compact.MinCompressionFraction (compaction.min_compression_fraction)", c.Compact.MinCompressionFraction)
	if c.ProxyRelief < 0 || c.ProxyRelief > 1 {
		errs = append(errs, fmt.Errorf("ProxyRelief (proxy.window_relief): must be between 0 and 1, or 0 for the default (got %v)", c.ProxyRelief))
	}
	if c.CompactThreshold < 0 {
		errs = append(errs, fmt.Errorf("CompactThreshold (compaction.threshold): must not be negative (got %v; over 1: never before a request)", c.CompactThreshold))
	}
	for name, v := range map[string]int64{
		"Keep.MinShare": int64(c.Keep.MinShare), "MaxTokens": int64(c.MaxTokens), "Base64CacheBytes": c.Base64CacheBytes,
		"ShrinkPixelsPerRequest (media.shrink_max_pixels_per_request)": c.ShrinkPixelsPerRequest,
		"ShrinkMemory (media.shrink_memory)":                           c.ShrinkMemory, "ShrinkWait (media.shrink_wait)": int64(c.ShrinkWait),
		"CacheTTL (keep.cache_ttl)": int64(c.CacheTTL), "ProxyMaxImages (proxy.max_images)": int64(c.ProxyMaxImages),
		"ProxyCached": int64(c.ProxyCached), "Compact.ImageTokenEstimate (compaction.image_token_estimate)": int64(c.Compact.ImageTokenEstimate),
	} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s: must not be negative (got %d; 0 takes the default)", name, v))
		}
	}
	if c.Hints.ContextWindow < 0 {
		errs = append(errs, fmt.Errorf("Hints.ContextWindow: must not be negative (got %d)", c.Hints.ContextWindow))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("engine configuration: %w", err)
	}
	return nil
}
