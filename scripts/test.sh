#!/usr/bin/env bash
# Runs every test of every crate of the workspace (redfence, redfence-postgres, redfence-cli,
# the bench and the test harness): installs what is missing, builds the offline Redis image
# for the docker-compose harness when Docker is available, then `cargo test --workspace
# --all-features`; then the Redis-facing real-server suites (the core's and the command's) a
# second time against Valkey 8.1, a third time against Valkey 9.1 and a fourth against Redis
# 8.6 (the servers scripts/setup.sh installs), the local torture run on Valkey 9.1 too, and
# 5,000 seeds of the deterministic simulation (redfence-sim).
#
# The docker-compose scenarios are #[ignore]d in a plain `cargo test` (they need the five
# containers); here they run with `--ignored` where Docker and compose work, and are reported
# as skipped (with the reason) where they do not.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

# The same detection as docker/nodes.sh: docker-compose v1, or the `docker compose` plugin.
compose_works() {
    command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1 || return 1
    command -v docker-compose >/dev/null 2>&1 && return 0
    docker compose version >/dev/null 2>&1
}

docker_ok=0
if compose_works; then
    bash docker/build-image.sh
    export REDFENCE_DOCKER=1
    docker_ok=1
    # The compose tests bring the five nodes up; take them down whatever happens.
    trap 'bash docker/nodes.sh down >/dev/null 2>&1 || true' EXIT
fi

# Everything but the torture runs, then the torture runs with their figures printed. Every
# build of all features says --workspace: a build of one package unifies other features of
# the dependencies and builds everything a second time.
cargo test --workspace --all-features -- --skip torture_
# TLS through native-tls too (with all features, redis-rs uses rustls), and the unit tests
# without any feature (the messages that name the TLS feature to enable).
cargo test --features tls-native-tls --test tls
cargo test -p redfence --lib
cargo test --workspace --all-features --test torture -- --nocapture torture_local
if [ "$docker_ok" -eq 1 ]; then
    cargo test --workspace --all-features --test safety -- --ignored
    cargo test --workspace --all-features --test torture -- --ignored --nocapture torture_compose
else
    echo "[test] SKIPPED: the docker-compose scenarios (tests/safety.rs *_compose, torture_compose):"
    echo "[test]   Docker, its daemon, or docker-compose / 'docker compose' is not available here"
fi

# The real-server suites again, against Valkey 8.1 and 9.1 and Redis 8.6 (plain commands with
# DELEX): every test target of the core
# crate and of the command (a file tests/NAME.rs, or a folder tests/NAME/ with a main.rs;
# tests/support/ is a module, not a target) but the torture runs and TLS (the PyPI Valkey
# builds have no TLS support; Redis 8.6 has it, but one TLS run suffices); not redfence-postgres's (they test PostgreSQL, and ran above).
# The compose scenarios stay #[ignore]d.
valkey8="${REDFENCE_VALKEY:-${REDFENCE_VALKEY_VENV:-/opt/redfence-valkey}/bin/valkey-server}"
valkey9="${REDFENCE_VALKEY9:-${REDFENCE_VALKEY9_VENV:-/opt/redfence-valkey9}/bin/valkey-server}"
redis8="${REDFENCE_REDIS8:-${REDFENCE_REDIS8_DIR:-/opt/redfence-redis8}/bin/redis-server}"
# The test targets under $1/tests, as --test NAME arguments.
test_targets() {
    local file name
    for file in "$1"/tests/*.rs "$1"/tests/*/main.rs; do
        [ -f "$file" ] || continue
        case "$file" in
            */main.rs) name="$(basename "$(dirname "$file")")" ;;
            *) name="$(basename "$file" .rs)" ;;
        esac
        case "$name" in
            torture | tls) ;;
            *) printf '%s\n' --test "$name" ;;
        esac
    done
}
mapfile -t core_targets < <(test_targets .)
mapfile -t cli_targets < <(test_targets redfence-cli)
# `--workspace` (less redfence-postgres, whose targets share names with the core's) keeps the
# features of the first build, so nothing is built again.
for server in "$valkey8" "$valkey9" "$redis8"; do
    echo "[test] the real-server suites against $("$server" --version | cut -d' ' -f1-3)"
    REDIS_SERVER="$server" cargo test --workspace --exclude redfence-postgres --all-features \
        "${core_targets[@]}" "${cli_targets[@]}" -- --skip torture_
done
# The local torture run once more on Valkey 9.1, where single-key locks go as plain commands
# (SET NX GET, SET IFEQ, DELIFEQ) instead of the script.
echo "[test] the local torture run against $("$valkey9" --version | cut -d' ' -f1-3)"
REDFENCE_VALKEY="$valkey9" cargo test --workspace --all-features --test torture -- --nocapture \
    torture_local

# The deterministic simulation (redfence-sim/): the real client over simulated servers, with
# seeded faults and checkers on true time. Its tests (regression seeds, planted bugs, replay)
# ran above; here 5,000 seeds more, with the optimised build (about a minute on two cores).
# A failing seed is named, and replays with `redfence-sim --seed S --trace`.
echo "[test] the deterministic simulation: 5,000 seeds"
cargo run --release --quiet -p redfence-sim -- --seeds 5000 --first-seed 0
