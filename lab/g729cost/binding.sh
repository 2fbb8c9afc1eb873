#!/usr/bin/env bash
# The cost of relayd's bcg729 binding (slowpath/codec/g729), in instructions:
# BenchmarkEncode and BenchmarkDecode call bcg729 through cgo once per 10 ms
# frame; BenchmarkEncodeC and BenchmarkDecodeC run the same frames in one C
# loop. Each runs under callgrind at two frame counts, and the difference
# (frames of the second run minus the first) cancels start-up: what is left
# is the instructions per frame, repeatable whatever else the machine does,
# unlike wall time on a shared VM. Prints instructions per frame, Go and C,
# and the binding's overhead. Needs valgrind and libbcg729-dev.
#
#   lab/g729cost/binding.sh [runs]     (default 3 runs: prints each)
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go test -c -o "$tmp/g729.test" ./slowpath/codec/g729/

# ir BENCH FRAMES: instructions callgrind collected for the whole process.
# Go's asynchronous preemption signals trip callgrind: off.
ir() {
	GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind --callgrind-out-file="$tmp/out" \
		"$tmp/g729.test" -test.run='^$' -test.bench="^Benchmark$1\$" -test.benchtime="$2x" -test.cpu=1 \
		>/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
	sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$tmp/err"
}
perframe() { echo $(( ($(ir "$1" 1200) - $(ir "$1" 200)) / 1000 )); }

for r in $(seq "$runs"); do
	for op in Encode Decode; do
		g=$(perframe "$op") c=$(perframe "${op}C")
		awk -v r="$r" -v op="$op" -v g="$g" -v c="$c" 'BEGIN {
			printf "run %d %s: %d instructions per frame through the binding, %d from C: overhead %.2f %%\n",
				r, op, g, c, 100 * (g - c) / c }'
	done
done
