#!/usr/bin/env bash
# Builds kiln for the GPU machine HERE, on the CPU machine (its nvcc is the
# same CUDA 13; binaries built here run there: ../shared/GPU-MACHINE.md),
# and packs what a device call runs into .gpu-build.tar.xz, so that the
# call skips its own build (about two of a five-minute call's minutes).
#
#   tools/gpu-prebuild.sh TARGET...    e.g. kiln_cli ops_test_cuda_llm_ops kiln_bench
#
# Carry it with the dependencies: carry [".gpu-deps.tar.xz",
# ".gpu-build.tar.xz"]; there tools/gpu-env.sh unpacks it into build-gpu
# and kiln_gpu_build uses it when every target it is asked for is in it
# (else it builds, as without it). The pack holds the targets' programs,
# libkiln.so and build-gpu/PREBUILT, which names the commit (and
# "dirty" with a hash of the uncommitted diff) it was built from; the
# device call prints that line. The build is gpu-env's own (Release, -O2,
# sm_90, no timeline) in KILN_PREBUILD_DIR (default build-gpu-local, so
# that it does not collide with a build-gpu unpacked here). The 64 MiB
# carry limit holds kiln, libkiln.so and four or five of the op tests or
# benches (each links the library statically, ~8 MB packed).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -eq 0 ] || [ "$1" = --help ] || [ "$1" = -h ]; then
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    [ $# -eq 0 ] && exit 2 || exit 0
fi
KILN_GPU_NO_UNPACK=1 . tools/gpu-env.sh
KILN_BUILD_DIR="$(pwd)/${KILN_PREBUILD_DIR:-build-gpu-local}"
KILN_GPU_LOGS="$KILN_BUILD_DIR/logs"
mkdir -p "$KILN_GPU_LOGS"
echo "building $* in $KILN_BUILD_DIR (log: $KILN_GPU_LOGS/build.log)"
kiln_gpu_build "$@"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build-gpu/lib"
cp "$KILN_BUILD_DIR/lib/libkiln.so" "$stage/build-gpu/lib/"
for t in "$@"; do
    f=$(kiln_gpu_target_file "$KILN_BUILD_DIR" "$t") || { echo "gpu-prebuild: no program for target $t" >&2; exit 1; }
    mkdir -p "$stage/build-gpu/$(dirname "$f")"
    cp "$KILN_BUILD_DIR/$f" "$stage/build-gpu/$f"
done
src="$(git rev-parse --short HEAD)"
if ! git diff --quiet HEAD; then
    src="$src dirty $(git diff HEAD | sha1sum | cut -c1-12)"
fi
echo "$src built $(date -u +%Y-%m-%dT%H:%MZ) targets: $*" > "$stage/build-gpu/PREBUILT"
tar cf - -C "$stage" build-gpu | xz -T0 -6 > .gpu-build.tar.xz
echo "packed .gpu-build.tar.xz ($(du -h .gpu-build.tar.xz | cut -f1)): $(cat "$stage/build-gpu/PREBUILT")"
