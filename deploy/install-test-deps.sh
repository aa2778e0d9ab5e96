#!/usr/bin/env bash
# Debian packages the test suite needs: promtool + the Prometheus server (package
# "prometheus"), headless Chromium (package "chromium"), the PostgreSQL server (package
# "postgresql", for deploy/postgres/pg-up.sh), kcat (a librdkafka client: the Kafka tests produce
# every compression codec with it and read the releases the way README.md shows) and openssl (the
# TLS test broker's self-signed CA; keytool comes with the JDK the broker needs anyway) and
# systemd-analyze (package "systemd": tests/system/test_deploy.py verifies the unit file with it). The
# Kubernetes manifests are validated with the kubernetes-validate package of the dev extra.
# Under CI=true a test whose component is missing fails (tests/conftest.py), so all are needed.
# Idempotent: does nothing when all are already installed. Run as root (CI images) or through sudo.
set -euo pipefail
have_postgres() { ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; }
need=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || need+=(prometheus)
command -v chromium >/dev/null || need+=(chromium)
have_postgres || need+=(postgresql)
command -v kcat >/dev/null || need+=(kcat)
command -v openssl >/dev/null || need+=(openssl)
command -v systemd-analyze >/dev/null || need+=(systemd)
if [ "${#need[@]}" -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update
$SUDO apt-get install -y --no-install-recommends "${need[@]}"
command -v promtool && command -v prometheus && command -v chromium && have_postgres \
  && command -v kcat && command -v openssl && command -v systemd-analyze
