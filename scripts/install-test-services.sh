#!/usr/bin/env bash
# Install the real servers the metrics tests talk to (Prometheus and its Pushgateway).
# Idempotent: does nothing when both binaries are present.  Installs only as root with apt-get;
# elsewhere it says why not and exits 0 (the tests then skip, or fail when CI=true).
set -uo pipefail

need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-pushgateway >/dev/null 2>&1 || need+=(prometheus-pushgateway)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-test-services: not root; cannot install ${need[*]} (metrics server tests will skip)" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-test-services: no apt-get; cannot install ${need[*]} (metrics server tests will skip)" >&2
  exit 0
fi
echo "install-test-services: installing ${need[*]}" >&2
# The packages' maintainer scripts try to start services; policy-rc.d exit 101 tells
# invoke-rc.d not to (tests start their own processes with their own config in a temp dir).
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
fi
export DEBIAN_FRONTEND=noninteractive
status=0
apt-get update -q >/dev/null || status=$?
if [ $status -eq 0 ]; then
  apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null || status=$?
fi
if [ $made_policy -eq 1 ]; then
  rm -f "$policy"
fi
if [ $status -ne 0 ]; then
  echo "install-test-services: apt-get failed (status $status); metrics server tests will skip" >&2
fi
exit 0
