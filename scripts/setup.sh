#!/usr/bin/env bash
# Installs what the tests and the demo need and a fresh Debian machine lacks:
# redis-server and the PostgreSQL server binaries (from Debian's packages).
set -euo pipefail

missing=()
command -v "${REDIS_SERVER:-redis-server}" >/dev/null 2>&1 || missing+=(redis-server)
if [ -z "${PG_BIN:-}" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    missing+=(postgresql)
fi

if [ ${#missing[@]} -eq 0 ]; then
    echo "[setup] redis-server and PostgreSQL are installed"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "[setup] missing: ${missing[*]}; install them (e.g. sudo apt-get install ${missing[*]})" >&2
    exit 1
fi

echo "[setup] installing from Debian's packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# The packages' services are not needed: the tests start their own servers.
policy=/usr/sbin/policy-rc.d
created_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && created_policy=1
fi
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
[ "$created_policy" -eq 1 ] && rm -f "$policy"
echo "[setup] installed: ${missing[*]}"
