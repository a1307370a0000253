#!/usr/bin/env bash
# Install the Debian packages the test suite needs (allocators, compilers, servers). Idempotent:
# packages already present are not fetched again. Needs root (or sudo).
set -euo pipefail

PACKAGES=(
  python3-venv                                    # `python3 -m venv` of the Makefile's .venv
  gcc libc6-dev binutils                          # the LD_PRELOAD shim and test C programs
  libjemalloc2 libjemalloc-dev                    # jemalloc (mallctl, jeprof)
  libgoogle-perftools4 libtcmalloc-minimal4 google-perftools libgoogle-perftools-dev  # tcmalloc, heap profiler
  util-linux                                      # setpriv, for the permission tests
  prometheus prometheus-alertmanager              # promtool, rules tests, the alerting end-to-end test
  prometheus-process-exporter                     # the peer of benchmarks/serve_cost.py
  etcd-server tzdata                              # the etcd coordinator; time windows in a time zone
  openjdk-17-jdk-headless                         # javac, java and jcmd for the JVM histogram tests
  chromium fonts-dejavu-core                      # the dashboard rendered in a real headless browser
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "system packages: all present"
  exit 0
fi
echo "system packages: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "system packages: done"
