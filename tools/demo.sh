#!/usr/bin/env bash
# The main job on a fresh machine: install, build, then build the ScaleBias
# example network into an engine and run it with a check against the
# reference path.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/build.sh build
plugin=build/lib/libkiln_scale_bias.so
engine=${TMPDIR:-/tmp}/sb.engine
echo "+ kiln build examples/scale_bias/net.json -o $engine --plugins $plugin"
build/bin/kiln build examples/scale_bias/net.json -o "$engine" --plugins "$plugin"
echo "+ kiln exec $engine --plugins $plugin --shapes input:4x1024 --check"
build/bin/kiln exec "$engine" --plugins "$plugin" --shapes input:4x1024 --check
