#!/usr/bin/env bash
# Runs every fuzz target for a while (default 60 s each), one after another,
# on one worker. Not part of `go test ./...`, which runs only the seeds.
#   scripts/fuzz.sh           # 60 s per target
#   scripts/fuzz.sh 10s       # 10 s per target
#   scripts/fuzz.sh 5s 1s     # CI's budget: 5 s each, 1 s to minimize a new input
#
# A new interesting input is minimized before fuzzing goes on (no execs
# meanwhile): the second argument bounds that, default 10 s.
# Go 1.26's fuzz coordinator can end a clean run with "context deadline
# exceeded" and no failing input (go.dev/issue/75804, fixed in Go 1.27).
# Such a run is retried once and, if it repeats, reported as a flake rather
# than a crash: a real crash always writes its input under testdata/fuzz.
set -euo pipefail
cd "$(dirname "$0")/.."
time=${1:-60s}
minimize=${2:-10s}
fail=0

run() { # dir target log
  go test "$1" -run XXX -fuzz "^$2\$" -fuzztime "$time" -fuzzminimizetime "$minimize" -parallel 1 >"$3" 2>&1
}

# progress prints a passing run's last count of executions. On a loaded
# machine the baseline (the seed corpus) can take the whole budget, and the
# run passes without one: under pipefail a bare grep then stopped the script.
progress() { # log
  grep -E 'execs' "$1" | tail -1 || echo "   passed; the budget went to the seed corpus's baseline (no executions counted)"
}

coordinator_flake() { # log
  grep -q 'context deadline exceeded' "$1" && ! grep -q 'Failing input written to' "$1"
}

for pkg in $(go list ./...); do
  dir=.${pkg#github.com/imgctx/imgctx}
  for target in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
    printf '== %s %s (%s)\n' "$dir" "$target" "$time"
    log=$(mktemp)
    if run "$dir" "$target" "$log"; then
      progress "$log"
    elif coordinator_flake "$log" && { echo "   coordinator timeout, no input: retrying"; run "$dir" "$target" "$log"; }; then
      progress "$log"
    elif coordinator_flake "$log"; then
      echo "   coordinator timeout again, no failing input (go.dev/issue/75804): flake, not a crash"
    else
      fail=1
      grep -v '^fuzz: elapsed' "$log" | tail -40 # the failure, whole
    fi
    rm -f "$log"
  done
done
exit $fail
