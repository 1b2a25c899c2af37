#!/usr/bin/env bash
# Runs each test stage whatever the others did, then prints one summary of all of them.
# Usage: test-stages.sh NAME COMMAND [NAME COMMAND ...]; exits non-zero when any stage failed.
set -uo pipefail

names=()
results=()
failed=0
while [ $# -ge 2 ]; do
  name=$1 command=$2
  shift 2
  echo "== $name"
  start=$(date +%s)
  bash -c "$command"
  rc=$?
  seconds=$(( $(date +%s) - start ))
  names+=("$name")
  if [ $rc -eq 0 ]; then
    results+=("passed  ${seconds}s")
  else
    results+=("FAILED  ${seconds}s (exit $rc)")
    failed=1
  fi
done

echo
echo "== test stages"
for i in "${!names[@]}"; do
  printf '  %-58s %s\n' "${names[$i]}" "${results[$i]}"
done
exit $failed
