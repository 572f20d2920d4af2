#!/usr/bin/env bash
# The whole test suite, run RUNS times in a row (default 3) in a fresh clone of this checkout's
# HEAD while BUSY processes (default 2) keep the cores busy: a test that leans on the machine's
# speed or on luck shows here. Prints one line per run and the counts at the end; each run's
# output is kept in OUT (default ~/.cache/sandfork/soak/<commit>/run-N.log).
#   bash benchmarks/soak_suite.sh [RUNS] [BUSY]
set -uo pipefail
runs=${1:-3}
busy=${2:-2}
source=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$source" rev-parse --short HEAD)
out=${OUT:-$HOME/.cache/sandfork/soak/$commit}
clone=$(mktemp -d /tmp/sandfork-soak.XXXXXX)
mkdir -p "$out"
git clone -q "$source" "$clone"

loads=()
stop_load() { kill "${loads[@]}" 2>/dev/null; }
trap stop_load EXIT
for _ in $(seq "$busy"); do
  bash -c 'while :; do :; done' &
  loads+=($!)
done

echo "commit $commit, $runs runs, $busy busy loops, clone $clone, logs in $out"
failed_runs=0
for run in $(seq "$runs"); do
  start=$(date +%s)
  (cd "$clone" && .ci/run) >"$out/run-$run.log" 2>&1
  code=$?
  took=$(($(date +%s) - start))
  counts=$(grep -E '^=+ .*(passed|failed).* in ' "$out/run-$run.log" | sed 's/=//g' | paste -sd ';')
  echo "run $run: exit $code after ${took}s: $counts"
  grep -E '^(FAILED|ERROR) ' "$out/run-$run.log" | sed 's/^/    /'
  [ "$code" -eq 0 ] || failed_runs=$((failed_runs + 1))
done
echo "$((runs - failed_runs)) of $runs runs passed"
rm -rf "$clone"
[ "$failed_runs" -eq 0 ]
