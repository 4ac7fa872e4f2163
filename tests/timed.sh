#!/usr/bin/env bash
# tests/timed.sh NAME COMMAND...: run COMMAND, add "NAME<TAB>seconds<TAB>status" to build/times.tsv
# (make test prints that table at the end: tests/run_scenarios.py --report), exit with its status.
set -u
name=$1
shift
start=$(date +%s)
status=0
"$@" || status=$?
mkdir -p "$(dirname "$0")/../build"
printf '%s\t%s\t%s\n' "$name" "$(( $(date +%s) - start ))" "$status" >> "$(dirname "$0")/../build/times.tsv"
exit "$status"
