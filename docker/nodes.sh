#!/usr/bin/env bash
# Control the redfence Redis harness (docker/docker-compose.yml): five
# independent Redis masters on 127.0.0.1:7001..7005.
#
# Usage: docker/nodes.sh COMMAND [N]        (N = node number 1..5)
#
#   up                 build the local image if needed, start all five nodes,
#                      wait until each answers PING on its host port
#   down               stop and remove containers, network and volumes
#   status             per-node state / health / PING / fault table
#   urls               print the REDFENCE_NODES value for the examples
#   wait N             wait until node N answers PING on 127.0.0.1:700N
#   kill N             SIGKILL node N (port then refuses connections)
#   restart N          start node N again (after kill; restarts it if running);
#                      without persistence it comes back EMPTY
#   pause N            freeze node N (docker pause): connections are accepted
#                      but nothing is answered until unpause, then the
#                      queued commands ARE executed (a "GC pause")
#   unpause N          thaw node N
#   disconnect N       network partition: DROP all non-loopback TCP traffic to
#                      port 6379 inside node N's network namespace; host
#                      clients via 127.0.0.1:700N (and other containers) hang,
#                      existing connections stall; the process keeps running
#                      and keeps its data
#   connect N          remove that rule; stalled connections resume
#   net-disconnect N   `docker network disconnect` node N from the compose
#                      network. NOTE: this also unpublishes 127.0.0.1:700N, so
#                      clients get EOF / "connection refused", not a timeout
#   net-connect N      `docker network connect` it back (port is re-published)
#
# Env:
#   REDFENCE_REDIS_IMAGE   image (default redfence/redis:local, built offline by
#                          docker/build-image.sh; e.g. redis:7 to use the
#                          official image, pulled by compose)
#   REDFENCE_FSYNC=1       include docker-compose.fsync.yml on `up`
#                          (AOF + appendfsync always, volume per node)
#   COMPOSE_PROJECT_NAME   compose project (default redfence)
#   REDFENCE_WAIT_TIMEOUT  seconds to wait for PING (default 30)
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export REDFENCE_REDIS_IMAGE="${REDFENCE_REDIS_IMAGE:-redfence/redis:local}"
PROJECT="${COMPOSE_PROJECT_NAME:-redfence}"
NETWORK="${PROJECT}_default"
WAIT_TIMEOUT="${REDFENCE_WAIT_TIMEOUT:-30}"
NODES=(1 2 3 4 5)
BASE_PORT=7000
RULE_COMMENT="redfence-disconnect"

log() { printf '[nodes] %s\n' "$*"; }
die() { printf '[nodes] ERROR: %s\n' "$*" >&2; exit 1; }
usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }
usage_die() {
    printf '[nodes] ERROR: %s\n' "$*" >&2
    printf 'usage: %s {up|down|status|urls|wait N|kill N|restart N|pause N|unpause N|disconnect N|connect N|net-disconnect N|net-connect N}  (N = 1..5; --help for details)\n' "$0" >&2
    exit 2
}

# ---------------------------------------------------------------- helpers --

compose() {
    local -a files=(-f "$SCRIPT_DIR/docker-compose.yml")
    if [ "${REDFENCE_FSYNC:-0}" = "1" ] || [ "${COMPOSE_WITH_FSYNC:-0}" = "1" ]; then
        files+=(-f "$SCRIPT_DIR/docker-compose.fsync.yml")
    fi
    if command -v docker-compose >/dev/null 2>&1; then
        docker-compose -p "$PROJECT" "${files[@]}" "$@"
    elif docker compose version >/dev/null 2>&1; then
        docker compose -p "$PROJECT" "${files[@]}" "$@"
    else
        die "neither docker-compose nor the 'docker compose' plugin is available"
    fi
}

port_of() { printf '%d' "$((BASE_PORT + $1))"; }

check_node() {
    case "${1:-}" in
        1|2|3|4|5) ;;
        "") usage_die "command '$CMD' needs a node number 1..5" ;;
        *) usage_die "invalid node '$1' (expected 1..5)" ;;
    esac
}

# Container id of node N (running or not), empty if none.
container_of() {
    docker ps -aq \
        --filter "label=com.docker.compose.project=$PROJECT" \
        --filter "label=com.docker.compose.service=redis$1" | head -n 1
}

need_container() {
    local id
    id="$(container_of "$1")"
    [ -n "$id" ] || die "node $1 (service redis$1, project $PROJECT) has no container; run '$0 up' first"
    printf '%s' "$id"
}

state_of() { docker inspect -f '{{.State.Status}}' "$1" 2>/dev/null || printf 'missing'; }

# PING 127.0.0.1:PORT with a hard timeout; succeeds only on +PONG.
ping_port() {
    local port="$1" t="${2:-2}"
    if command -v redis-cli >/dev/null 2>&1; then
        [ "$(timeout "$t" redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = "PONG" ]
    else
        # Fallback without redis-cli: raw RESP over bash's /dev/tcp.
        # shellcheck disable=SC2016
        timeout "$t" bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf "PING\r\n" >&3 \
            && IFS= read -r line <&3 && [ "${line%$'"'"'\r'"'"'}" = "+PONG" ]' _ "$port" 2>/dev/null
    fi
}

wait_node() {
    local n="$1" port deadline
    port="$(port_of "$n")"
    deadline=$((SECONDS + WAIT_TIMEOUT))
    until ping_port "$port" 1; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            die "node $n (127.0.0.1:$port) did not answer PING within ${WAIT_TIMEOUT}s"
        fi
        sleep 0.2
    done
    log "node $n (127.0.0.1:$port) answers PING"
}

# Run a command inside node N's network namespace (host binaries).
in_netns() {
    local id="$1" pid
    shift
    pid="$(docker inspect -f '{{.State.Pid}}' "$id")"
    if [ -z "$pid" ] || [ "$pid" = "0" ]; then die "container $id is not running"; fi
    nsenter -t "$pid" -n -- "$@"
}

# The DROP rule: everything to tcp/6379 that does not come in on loopback
# (so the in-container healthcheck keeps working).
RULE=(INPUT ! -i lo -p tcp --dport 6379 -m comment --comment "$RULE_COMMENT" -j DROP)

fw_tool() {
    command -v nsenter >/dev/null 2>&1 || die "nsenter not found (package util-linux)"
    if command -v iptables >/dev/null 2>&1; then printf 'iptables'
    elif command -v nft >/dev/null 2>&1; then printf 'nft'
    else die "need iptables or nft on the host for disconnect (apt-get install iptables)"
    fi
}

is_blackholed() {
    local id="$1"
    case "$(fw_tool)" in
        iptables) in_netns "$id" iptables -w -C "${RULE[@]}" 2>/dev/null ;;
        nft) in_netns "$id" nft list table inet redfence >/dev/null 2>&1 ;;
    esac
}

require_running() {
    local n="$1" id="$2" st
    st="$(state_of "$id")"
    case "$st" in
        running|paused) ;;
        *) die "node $n is $st, not running" ;;
    esac
}

# --------------------------------------------------------------- commands --

cmd_up() {
    if ! docker image inspect "$REDFENCE_REDIS_IMAGE" >/dev/null 2>&1; then
        case "$REDFENCE_REDIS_IMAGE" in
            redfence/*) "$SCRIPT_DIR/build-image.sh" ;;
            *) log "image $REDFENCE_REDIS_IMAGE not present locally; compose will try to pull it" ;;
        esac
    fi
    log "starting project $PROJECT with image $REDFENCE_REDIS_IMAGE$([ "${REDFENCE_FSYNC:-0}" = 1 ] && printf ' (fsync variant)')"
    compose up -d
    local n
    for n in "${NODES[@]}"; do wait_node "$n"; done
    log "all nodes up: REDFENCE_NODES=$(urls)"
}

cmd_down() {
    local n id
    # Thaw paused nodes first so they stop promptly.
    for n in "${NODES[@]}"; do
        id="$(container_of "$n")"
        if [ -n "$id" ] && [ "$(state_of "$id")" = "paused" ]; then docker unpause "$id" >/dev/null; fi
    done
    # Include the fsync override whenever the project owns named volumes, so
    # they are removed even if REDFENCE_FSYNC is not set now.
    local with_fsync=0
    if [ -n "$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT")" ]; then
        with_fsync=1
    fi
    COMPOSE_WITH_FSYNC="$with_fsync" compose down -v --remove-orphans --timeout 5
    local left
    left="$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT")"
    [ -z "$left" ] || die "containers still present after down: $left"
    log "project $PROJECT is down (containers, network and volumes removed)"
}

urls() {
    local n out=""
    for n in "${NODES[@]}"; do out+="${out:+,}redis://127.0.0.1:$(port_of "$n")"; done
    printf '%s\n' "$out"
}

cmd_status() {
    local n id st health ping fault
    printf '%-5s %-15s %-13s %-9s %-10s %-5s %s\n' NODE ADDRESS CONTAINER STATE HEALTH PING FAULT
    for n in "${NODES[@]}"; do
        id="$(container_of "$n")"
        st=missing health=- fault=-
        if [ -n "$id" ]; then
            st="$(state_of "$id")"
            health="$(docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}-{{end}}' "$id")"
            if [ "$st" = running ] || [ "$st" = paused ]; then
                if is_blackholed "$id"; then fault=disconnected; fi
                if [ -z "$(docker inspect -f '{{range $k, $v := .NetworkSettings.Networks}}{{$k}}{{end}}' "$id")" ]; then
                    fault=net-disconnected
                fi
            fi
        fi
        if ping_port "$(port_of "$n")" 1; then ping=PONG; else ping=FAIL; fi
        printf '%-5s %-15s %-13s %-9s %-10s %-5s %s\n' "$n" "127.0.0.1:$(port_of "$n")" \
            "${id:0:12}" "$st" "$health" "$ping" "$fault"
    done
}

cmd_kill() {
    local id
    id="$(need_container "$1")"
    require_running "$1" "$id"
    docker kill -s KILL "$id" >/dev/null
    log "node $1 killed (SIGKILL); 127.0.0.1:$(port_of "$1") now refuses connections"
}

cmd_restart() {
    local id st
    id="$(need_container "$1")"
    st="$(state_of "$id")"
    case "$st" in
        paused) docker unpause "$id" >/dev/null; docker restart -t 5 "$id" >/dev/null ;;
        running) docker restart -t 5 "$id" >/dev/null ;;
        *) docker start "$id" >/dev/null ;;
    esac
    log "node $1 (re)started from state '$st'"
    wait_node "$1"
}

cmd_pause() {
    local id
    id="$(need_container "$1")"
    require_running "$1" "$id"
    if [ "$(state_of "$id")" = paused ]; then log "node $1 already paused"; return; fi
    docker pause "$id" >/dev/null
    log "node $1 paused (connections accepted, no replies until unpause)"
}

cmd_unpause() {
    local id
    id="$(need_container "$1")"
    if [ "$(state_of "$id")" != paused ]; then log "node $1 is not paused"; return; fi
    docker unpause "$id" >/dev/null
    log "node $1 unpaused"
}

cmd_disconnect() {
    local id
    id="$(need_container "$1")"
    require_running "$1" "$id"
    if is_blackholed "$id"; then log "node $1 already disconnected"; return; fi
    case "$(fw_tool)" in
        iptables) in_netns "$id" iptables -w -A "${RULE[@]}" ;;
        nft)
            in_netns "$id" nft add table inet redfence
            in_netns "$id" nft add chain inet redfence input '{ type filter hook input priority -10 ; }'
            in_netns "$id" nft add rule inet redfence input iifname != lo tcp dport 6379 drop
            ;;
    esac
    log "node $1 disconnected: tcp/6379 traffic into its netns is DROPPED (127.0.0.1:$(port_of "$1") hangs)"
}

cmd_connect() {
    local id removed=0
    id="$(need_container "$1")"
    require_running "$1" "$id"
    case "$(fw_tool)" in
        iptables)
            while in_netns "$id" iptables -w -C "${RULE[@]}" 2>/dev/null; do
                in_netns "$id" iptables -w -D "${RULE[@]}"
                removed=1
            done
            ;;
        nft)
            if in_netns "$id" nft list table inet redfence >/dev/null 2>&1; then
                in_netns "$id" nft delete table inet redfence
                removed=1
            fi
            ;;
    esac
    if [ "$removed" -eq 1 ]; then
        log "node $1 reconnected (DROP rule removed)"
    else
        log "node $1 was not disconnected"
    fi
}

cmd_net_disconnect() {
    local id
    id="$(need_container "$1")"
    if docker network disconnect "$NETWORK" "$id" 2>/dev/null; then
        log "node $1 detached from $NETWORK; its published port is gone (clients get connection refused)"
    else
        log "node $1 was not attached to $NETWORK"
    fi
}

cmd_net_connect() {
    local id
    id="$(need_container "$1")"
    if docker inspect -f '{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}' "$id" | grep -qw -- "$NETWORK"; then
        log "node $1 is already attached to $NETWORK"
        return
    fi
    # Restore the compose service alias so other containers can resolve redisN.
    docker network connect --alias "redis$1" "$NETWORK" "$id"
    log "node $1 re-attached to $NETWORK (port 127.0.0.1:$(port_of "$1") re-published)"
}

# ------------------------------------------------------------------- main --

CMD="${1:-}"
[ -n "$CMD" ] || usage_die "missing command"
shift

needs_node() {
    check_node "${1:-}"
    [ "$#" -le 1 ] || usage_die "too many arguments for '$CMD'"
}
no_args() { [ "$#" -eq 0 ] || usage_die "'$CMD' takes no arguments"; }

command -v docker >/dev/null 2>&1 || die "docker is not installed / not on PATH"
case "$WAIT_TIMEOUT" in ''|*[!0-9]*) die "REDFENCE_WAIT_TIMEOUT must be a number of seconds" ;; esac

case "$CMD" in
    -h|--help|help) usage ;;
    up) no_args "$@"; cmd_up ;;
    down) no_args "$@"; cmd_down ;;
    status|ps) no_args "$@"; cmd_status ;;
    urls|env) no_args "$@"; urls ;;
    wait) needs_node "$@"; wait_node "$1" ;;
    kill) needs_node "$@"; cmd_kill "$1" ;;
    restart|start) needs_node "$@"; cmd_restart "$1" ;;
    pause) needs_node "$@"; cmd_pause "$1" ;;
    unpause) needs_node "$@"; cmd_unpause "$1" ;;
    disconnect) needs_node "$@"; cmd_disconnect "$1" ;;
    connect) needs_node "$@"; cmd_connect "$1" ;;
    net-disconnect) needs_node "$@"; cmd_net_disconnect "$1" ;;
    net-connect) needs_node "$@"; cmd_net_connect "$1" ;;
    *) usage_die "unknown command '$CMD'" ;;
esac
