//go:build race

package main

// raceEnabled: the race detector slows each request tenfold; tests about
// volume, not about concurrency, run without it.
const raceEnabled = true
