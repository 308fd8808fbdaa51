#!/usr/bin/env bash
# Runs every test: installs what is missing, builds the offline Redis image for the
# docker-compose harness when Docker is available, then `cargo test --all-features`.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

if command -v docker >/dev/null 2>&1 && command -v docker-compose >/dev/null 2>&1 \
    && docker info >/dev/null 2>&1; then
    bash docker/build-image.sh
    export REDFENCE_DOCKER=1
    # The compose tests bring the five nodes up; take them down whatever happens.
    trap 'bash docker/nodes.sh down >/dev/null 2>&1 || true' EXIT
else
    echo "[test] Docker or docker-compose is not available: the compose-harness tests will be skipped"
fi

# Everything but the torture runs, then the torture runs with their figures printed.
cargo test --all-features -- --skip torture_
cargo test --all-features --test torture -- --nocapture
