#!/usr/bin/env bash
# Runs the main demo against five Redis masters on 127.0.0.1:7001..7005. Uses the nodes
# already listening there (e.g. `docker/nodes.sh up`); otherwise starts five local
# redis-server processes for the demo and stops them afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

ports=(7001 7002 7003 7004 7005)
pids=()
workdir=""
cleanup() {
    if [ ${#pids[@]} -gt 0 ]; then kill "${pids[@]}" 2>/dev/null || true; fi
    if [ -n "$workdir" ]; then rm -rf "$workdir"; fi
}
trap cleanup EXIT

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if listening 7001; then
    echo "[demo] using the Redis nodes already on 127.0.0.1:7001..7005"
else
    workdir=$(mktemp -d)
    for port in "${ports[@]}"; do
        mkdir -p "$workdir/$port"
        "${REDIS_SERVER:-redis-server}" --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
            --dir "$workdir/$port" --logfile "$workdir/$port/redis.log" --daemonize no &
        pids+=($!)
    done
    for port in "${ports[@]}"; do
        for _ in $(seq 100); do listening "$port" && break; sleep 0.05; done
    done
    echo "[demo] started five local redis-server processes on 127.0.0.1:7001..7005"
fi

cargo run --quiet --example quickstart
