#!/usr/bin/env bash
# Installs the Debian packages kiln needs, then configures and builds into
# build/ (or into the folder given as $1, with extra CMake options after it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
dir=${1:-build}
shift || true
cmake -S . -B "$dir" -G Ninja "$@" >/dev/null
ninja -C "$dir" ${KILN_JOBS:+-j "$KILN_JOBS"}
