#!/usr/bin/env bash
# Install the real programs the tests talk to: Prometheus and its Pushgateway (metrics tests),
# Chromium and its WebDriver (the HTML report's browser test).
# Idempotent: does nothing when every binary is present.  Installs only as root with apt-get;
# elsewhere it says why not and exits 0 (the tests then skip, or fail when CI=true).
set -uo pipefail

# Two groups, installed separately so that one missing package does not block the other.
metrics=()
command -v prometheus >/dev/null 2>&1 || metrics+=(prometheus)
command -v prometheus-pushgateway >/dev/null 2>&1 || metrics+=(prometheus-pushgateway)
# Debian's chromium (/usr/bin/chromium) and chromium-driver (/usr/bin/chromedriver)
browser=()
command -v chromium >/dev/null 2>&1 || browser+=(chromium)
[ -x /usr/bin/chromedriver ] || browser+=(chromium-driver)
need=("${metrics[@]}" "${browser[@]}")
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-test-services: not root; cannot install ${need[*]} (their tests will skip)" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-test-services: no apt-get; cannot install ${need[*]} (their tests will skip)" >&2
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
# Another apt or dpkg (an unattended upgrade, a second `make test`) may hold the locks: wait for
# them, bounded (apt's own lock timeout, then a few retries of the whole command).
apt_locked_retry() {
  local tries=0 out rc
  while :; do
    out=$(apt-get -o DPkg::Lock::Timeout=120 "$@" 2>&1)
    rc=$?
    if [ $rc -eq 0 ] || ! grep -qi "lock" <<<"$out" || [ $tries -ge 5 ]; then
      [ $rc -eq 0 ] || printf '%s\n' "$out" | tail -n 3 >&2
      return $rc
    fi
    tries=$((tries + 1))
    echo "install-test-services: apt is locked by another process; waiting (try $tries of 5)" >&2
    sleep 20
  done
}
apt_locked_retry update -q || status=$?
for group in "${metrics[*]}" "${browser[*]}"; do
  [ -n "$group" ] || continue
  # shellcheck disable=SC2086  # one word per package
  if [ $status -ne 0 ] || ! apt_locked_retry install -y -q --no-install-recommends $group; then
    echo "install-test-services: could not install $group (apt-get update status $status);" \
      "the tests that need it will skip" >&2
  fi
done
if [ $made_policy -eq 1 ]; then
  rm -f "$policy"
fi
exit 0
