#!/usr/bin/env bash
# Debian packages the test suite needs: promtool + the Prometheus server (package
# "prometheus"), headless Chromium (package "chromium") and the PostgreSQL server (package
# "postgresql", for deploy/postgres/pg-up.sh). Idempotent: does nothing when all are already
# installed. Run as root (CI images) or through sudo.
set -euo pipefail
have_postgres() { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }
if command -v promtool >/dev/null && command -v prometheus >/dev/null && command -v chromium >/dev/null \
    && have_postgres; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends prometheus chromium postgresql
command -v promtool && command -v prometheus && command -v chromium && have_postgres
