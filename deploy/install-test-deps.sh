#!/usr/bin/env bash
# Debian packages the test suite needs: promtool + the Prometheus server (package
# "prometheus") and headless Chromium (package "chromium"). Idempotent: does nothing when both
# are already installed. Run as root (CI images) or through sudo.
set -euo pipefail
if command -v promtool >/dev/null && command -v prometheus >/dev/null && command -v chromium >/dev/null; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends prometheus chromium
command -v promtool && command -v prometheus && command -v chromium
