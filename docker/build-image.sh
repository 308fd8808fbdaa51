#!/usr/bin/env bash
# Build a small local Redis image for the redfence test harness WITHOUT pulling
# anything from a registry.
#
# The Debian redis-server / redis-cli binaries of the host (installed with
# apt-get when missing) are copied, together with every shared library `ldd`
# reports and the dynamic loader, into a scratch root filesystem, which is then
# turned into an image with `docker import`.
#
# Usage: docker/build-image.sh [--force]
#   --force   rebuild even if the image already exists
# Env:
#   REDFENCE_REDIS_IMAGE   image tag to produce (default: redfence/redis:local)
#   REDIS_SERVER           the redis-server binary to package (default: Debian's
#                          /usr/bin/redis-server; e.g. a valkey-server works too)
#   REDIS_CLI              the matching CLI (default: redis-cli beside it, or
#                          Debian's /usr/bin/redis-cli)
#
# The image has no ENTRYPOINT and redis-server on PATH, so the compose command
# `redis-server --port 6379 ...` works the same way as with the official
# `redis:7` image (whose docker-entrypoint.sh accepts `redis-server ...`).
set -euo pipefail

IMAGE="${REDFENCE_REDIS_IMAGE:-redfence/redis:local}"
FORCE=0

usage() {
    sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
}

log() { printf '[build-image] %s\n' "$*"; }
die() { printf '[build-image] ERROR: %s\n' "$*" >&2; exit 1; }

while [ "$#" -gt 0 ]; do
    case "$1" in
        -f|--force) FORCE=1 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown argument: $1" ;;
    esac
    shift
done

command -v docker >/dev/null 2>&1 || die "docker is not installed / not on PATH"
docker info >/dev/null 2>&1 || die "cannot talk to the Docker daemon (is it running? are you allowed to use it?)"

if [ "$FORCE" -eq 0 ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    log "image $IMAGE already exists ($(docker image inspect -f '{{.Id}}' "$IMAGE" | cut -c1-19)); nothing to do (use --force to rebuild)"
    exit 0
fi

# --------------------------------------------------------------------------
# 1. Make sure the Debian redis binaries are present on the host.
# --------------------------------------------------------------------------
SERVER_BIN=/usr/bin/redis-server
CLI_BIN=/usr/bin/redis-cli
if [ -n "${REDIS_SERVER:-}" ]; then
    SERVER_BIN="$(command -v "$REDIS_SERVER")" || die "REDIS_SERVER=$REDIS_SERVER is not an executable"
    beside="$(dirname "$(readlink -f "$SERVER_BIN")")"
    for cli in "${REDIS_CLI:-}" "$beside/redis-cli" "$beside/valkey-cli"; do
        if [ -n "$cli" ] && [ -x "$cli" ]; then CLI_BIN="$cli"; break; fi
    done
fi

install_redis_packages() {
    [ "$(id -u)" -eq 0 ] || die "redis-server/redis-cli missing and not root: run as root or 'apt-get install redis-server redis-tools' first"
    command -v apt-get >/dev/null 2>&1 || die "redis-server missing and apt-get not available (Debian/Ubuntu host required)"
    export DEBIAN_FRONTEND=noninteractive
    # Only refresh the package lists when apt does not know the package yet.
    if ! apt-cache policy redis-server 2>/dev/null | grep -q 'Candidate: [0-9]'; then
        log "apt-get update (redis-server unknown to apt)"
        apt-get update -q
    fi
    # We only want the binaries: keep the package's init script from starting
    # a redis service on the host (only if no policy-rc.d is in place already).
    local policy=/usr/sbin/policy-rc.d created_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 0755 "$policy"
        created_policy=1
    fi
    log "apt-get install redis-server redis-tools"
    local rc=0
    apt-get install -y -q --no-install-recommends redis-server redis-tools || rc=$?
    if [ "$rc" -ne 0 ]; then
        log "install failed (rc=$rc); retrying after apt-get update"
        rc=0
        apt-get update -q && apt-get install -y -q --no-install-recommends redis-server redis-tools || rc=$?
    fi
    if [ "$created_policy" -eq 1 ]; then rm -f "$policy"; fi
    [ "$rc" -eq 0 ] || die "apt-get install redis-server redis-tools failed"
}

if [ -z "${REDIS_SERVER:-}" ] && { [ ! -x "$SERVER_BIN" ] || [ ! -x "$CLI_BIN" ]; }; then
    install_redis_packages
fi
[ -x "$SERVER_BIN" ] || die "$SERVER_BIN still missing after install"
[ -x "$CLI_BIN" ] || die "$CLI_BIN still missing after install"
command -v ldd >/dev/null 2>&1 || die "ldd not found (package libc-bin)"

# --------------------------------------------------------------------------
# 2. Assemble the root filesystem.
# --------------------------------------------------------------------------
ROOTFS="$(mktemp -d /tmp/redfence-rootfs.XXXXXX)"
cleanup() { rm -rf "$ROOTFS"; }
trap cleanup EXIT

# /usr/bin/redis-server is a symlink to redis-check-rdb on Debian; redis picks
# its mode from argv[0], so the copy MUST be named redis-server.
mkdir -p "$ROOTFS/usr/local/bin"
install -m 0755 "$(readlink -f "$SERVER_BIN")" "$ROOTFS/usr/local/bin/redis-server"
install -m 0755 "$(readlink -f "$CLI_BIN")" "$ROOTFS/usr/local/bin/redis-cli"

# Shared libraries + dynamic loader, at the paths the binaries ask for. Prints
# each library it copied; fails (and so stops the build) on a missing one.
copy_libs() {
    local bin="$1" lib
    # ldd lines: "libfoo.so.1 => /lib/x86_64-linux-gnu/libfoo.so.1 (0x...)"
    #            "/lib64/ld-linux-x86-64.so.2 (0x...)"
    #            "linux-vdso.so.1 (0x...)"   (virtual, skipped)
    local list
    list="$(ldd "$bin" | awk '
        $2 == "=>" && $3 ~ /^\// { print $3; next }
        $2 == "=>" && $3 == "not" { print "MISSING:" $1; next }
        $1 ~ /^\// { print $1 }
    ')" || { printf 'ldd failed on %s\n' "$bin" >&2; return 1; }
    while read -r lib; do
        [ -n "$lib" ] || continue
        case "$lib" in
            MISSING:*) printf '%s: shared library %s not found\n' "$bin" "${lib#MISSING:}" >&2; return 1 ;;
        esac
        if [ ! -e "$ROOTFS$lib" ]; then
            mkdir -p "$ROOTFS$(dirname "$lib")" || return 1
            cp -L "$lib" "$ROOTFS$lib" || return 1
            printf '%s\n' "$lib"
        fi
    done <<<"$list"
}
SERVER_LIBS="$(copy_libs "$SERVER_BIN")" || die "could not copy the libraries of $SERVER_BIN"
CLI_LIBS="$(copy_libs "$CLI_BIN")" || die "could not copy the libraries of $CLI_BIN"
LIBS="$(printf '%s\n%s\n' "$SERVER_LIBS" "$CLI_LIBS")"
[ -e "$ROOTFS/lib64/ld-linux-x86-64.so.2" ] || ls "$ROOTFS"/lib*/ld-linux* >/dev/null 2>&1 \
    || die "dynamic loader not found in ldd output"

# Minimal /etc, /tmp and the data directory (uid/gid 999 like the official image).
mkdir -p "$ROOTFS/etc" "$ROOTFS/tmp" "$ROOTFS/data"
cat >"$ROOTFS/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
redis:x:999:999:redis:/data:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
EOF
cat >"$ROOTFS/etc/group" <<'EOF'
root:x:0:
redis:x:999:
nogroup:x:65534:
EOF
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$ROOTFS/etc/nsswitch.conf"
chmod 1777 "$ROOTFS/tmp"
chown 999:999 "$ROOTFS/data"
chmod 0755 "$ROOTFS/data"

# --------------------------------------------------------------------------
# 3. Import it.
# --------------------------------------------------------------------------
REDIS_VERSION="$("$SERVER_BIN" --version | sed -n 's/.* v=\([^ ]*\).*/\1/p')"
OLD_ID="$(docker image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)"

log "importing $(printf '%s\n' "$LIBS" | grep -c . ) libraries + redis-server/redis-cli $REDIS_VERSION as $IMAGE"
tar --numeric-owner -C "$ROOTFS" -cf - . | docker import \
    --message "redfence: Debian redis-server $REDIS_VERSION (no registry pull)" \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
    --change 'WORKDIR /data' \
    --change 'USER 999:999' \
    --change 'EXPOSE 6379' \
    --change 'ENTRYPOINT []' \
    --change 'CMD ["redis-server", "--port", "6379", "--protected-mode", "no", "--save", "", "--appendonly", "no"]' \
    --change "LABEL org.opencontainers.image.title=redfence-redis org.opencontainers.image.version=$REDIS_VERSION" \
    - "$IMAGE" >/dev/null

NEW_ID="$(docker image inspect -f '{{.Id}}' "$IMAGE")"
if [ -n "$OLD_ID" ] && [ "$OLD_ID" != "$NEW_ID" ]; then
    # Drop the superseded image if nothing uses it any more (ignore failures).
    if docker image rm "$OLD_ID" >/dev/null 2>&1; then
        log "removed superseded image ${OLD_ID:0:19}"
    fi
fi

# Smoke test: both binaries must start inside the image.
docker run --rm --network none "$IMAGE" redis-server --version >/dev/null \
    || die "smoke test failed: redis-server does not run inside $IMAGE"
docker run --rm --network none "$IMAGE" redis-cli --version >/dev/null \
    || die "smoke test failed: redis-cli does not run inside $IMAGE"

SIZE="$(docker image inspect -f '{{.Size}}' "$IMAGE")"
log "built $IMAGE (${NEW_ID:0:19}, $((SIZE / 1024 / 1024)) MiB, redis $REDIS_VERSION); smoke test OK"
