# Sourced on the GPU machine, from the repository root, by tools/gpu-check.sh
# and by one-off device calls: unpacks the carried .gpu-deps.tar.xz (made by
# tools/gpu-deps.sh) where .gpu-deps is missing, puts its libraries and
# pkg-config files and CUDA on the paths, and defines
#   kiln_gpu_build [TARGET...]   (nothing when a carried .gpu-build.tar.xz
#                                from tools/gpu-prebuild.sh holds every
#                                TARGET) configure build-gpu (Release, sm_90, no
#                                timeline, then $KILN_GPU_CMAKE_ARGS, e.g.
#                                -DKILN_CUDA_TIMELINE=ON, which the cache
#                                does not carry into the next build) and
#                                build the targets (all without any); logs
#                                in $KILN_GPU_LOGS/build.log
#   kiln_gpu_checkpoint 1b|8b DIR  start writing a random checkpoint of the
#                                Llama-3.2-1B or Llama-3.1-8B shape into
#                                DIR/ck in the background (the 8B's takes a
#                                minute or two: start it before the build)
#   kiln_gpu_checkpoint_wait 1b|8b  wait for it (once), saying so if it failed
#   kiln_gpu_engine 1b|8b DIR [BUILD ARG...]
#                                wait for it and build DIR/e.engine with
#                                build-gpu/bin/kiln: with the BUILD ARGs
#                                (kiln build's options), else bf16,
#                                --max-tokens 2048 (the 8B also --max-seq-len
#                                8448, room for an 8,192-token prompt)
# so that a measurement on the lent machine is
#   . tools/gpu-env.sh && kiln_gpu_build kiln_cli kiln_bench && build-gpu/bin/kiln ...
# Returns 2 (from the source) when the dependencies are not there.
kiln_root=$(pwd)
kiln_deps="$kiln_root/.gpu-deps"
if [ ! -d "$kiln_deps/lib/pkgconfig" ] && [ -f "$kiln_root/.gpu-deps.tar.xz" ]; then
    tar xJf "$kiln_root/.gpu-deps.tar.xz" -C "$kiln_root"
fi
if [ ! -d "$kiln_deps/lib/pkgconfig" ]; then
    echo "gpu-env: $kiln_deps is missing: run tools/gpu-deps.sh on the CPU machine and carry .gpu-deps.tar.xz" >&2
    return 2
fi
# Link names, in case the copy that came here dropped symlinks.
for kiln_lib in jansson xxhash pcre2-8 openblas; do
    if [ ! -e "$kiln_deps/lib/lib$kiln_lib.so" ]; then
        kiln_so=$(cd "$kiln_deps/lib" && ls "lib$kiln_lib.so."* 2>/dev/null | head -n1)
        [ -n "$kiln_so" ] && ln -sf "$kiln_so" "$kiln_deps/lib/lib$kiln_lib.so"
    fi
done
export PKG_CONFIG_PATH="$kiln_deps/lib/pkgconfig"
export LD_LIBRARY_PATH="$kiln_deps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="/usr/local/cuda/bin:$PATH"
command -v pkg-config >/dev/null 2>&1 || export PATH="$PATH:$kiln_deps/bin"
export KILN_BUILD_DIR="$kiln_root/build-gpu"
# A build made on the CPU machine (tools/gpu-prebuild.sh), carried as
# .gpu-build.tar.xz: unpacked once; its programs find libkiln.so here.
# (tools/gpu-prebuild.sh itself sets KILN_GPU_NO_UNPACK: it makes the pack)
if [ -z "${KILN_GPU_NO_UNPACK:-}" ] && [ -f "$kiln_root/.gpu-build.tar.xz" ] && [ ! -f "$KILN_BUILD_DIR/PREBUILT" ]; then
    tar xJf "$kiln_root/.gpu-build.tar.xz" -C "$kiln_root"
fi
export LD_LIBRARY_PATH="$KILN_BUILD_DIR/lib:$LD_LIBRARY_PATH"
: "${KILN_GPU_LOGS:=${OUT:-$KILN_BUILD_DIR}/logs}"
mkdir -p "$KILN_GPU_LOGS"

# Release at -O2: the level CI checks -Werror at (GCC's -O3 warns about
# more, e.g. maybe-uninitialized, and a warning must not stop the check).
# CMAKE_CUDA_ARCHITECTURES too, so nvcc's own default never applies.
# kiln_gpu_target_file DIR TARGET: the program TARGET builds, relative to
# the build folder DIR (kiln_cli is bin/kiln; the others are named as
# their target, under bin or tests).
kiln_gpu_target_file() {
    local t=$2
    [ "$t" = kiln_cli ] && t=kiln
    for f in "bin/$t" "tests/$t"; do
        [ -f "$1/$f" ] && { echo "$f"; return 0; }
    done
    return 1
}

kiln_gpu_build() {
    # a carried prebuilt build (tools/gpu-prebuild.sh) that has every
    # target asked for: nothing to build
    if [ -f "$KILN_BUILD_DIR/PREBUILT" ] && [ $# -gt 0 ]; then
        local t missing=0
        for t in "$@"; do
            kiln_gpu_target_file "$KILN_BUILD_DIR" "$t" >/dev/null || missing=1
        done
        if [ $missing = 0 ]; then
            echo "gpu-env: prebuilt on the CPU machine: $(cat "$KILN_BUILD_DIR/PREBUILT")"
            return 0
        fi
        echo "gpu-env: the prebuilt build lacks some of $*: building" >&2
    fi
    if ! cmake -S "$kiln_root" -B "$KILN_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
            -DCMAKE_C_FLAGS_RELEASE="-O2 -DNDEBUG" -DCMAKE_C_FLAGS="-Wno-error=maybe-uninitialized" \
            -DKILN_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_ARCHITECTURES=90 -DKILN_CUDA_TIMELINE=OFF ${KILN_GPU_CMAKE_ARGS:-} \
            >"$KILN_GPU_LOGS/configure.log" 2>&1; then
        tail -n 30 "$KILN_GPU_LOGS/configure.log"
        echo "gpu-env: configure FAILED" >&2
        return 1
    fi
    grep -q "CUDA backend ON" "$KILN_GPU_LOGS/configure.log" || echo "gpu-env: warning: CUDA backend is OFF (no nvcc?)" >&2
    if ! ninja -C "$KILN_BUILD_DIR" -j "$(nproc)" "$@" >"$KILN_GPU_LOGS/build.log" 2>&1; then
        grep -E "error|FAILED" "$KILN_GPU_LOGS/build.log" | head -n 30
        echo "gpu-env: build FAILED" >&2
        return 1
    fi
}

kiln_gpu_checkpoint() {
    local shape
    case "$1" in
        1b) shape=llama-3.2-1b ;;
        8b) shape=llama-3.1-8b ;;
        *) echo "gpu-env: the model is 1b or 8b, not $1" >&2; return 2 ;;
    esac
    mkdir -p "$2"
    python3 "$kiln_root/tools/make_random_checkpoint.py" "$2/ck" --model "$shape" >"$KILN_GPU_LOGS/checkpoint-$1.log" 2>&1 &
    kiln_gpu_ck_pid=$!
}

# kiln_gpu_checkpoint_wait 1b|8b: wait for the checkpoint kiln_gpu_checkpoint
# started (once; later calls return at once)
kiln_gpu_checkpoint_wait() {
    if [ -n "${kiln_gpu_ck_pid:-}" ] && ! wait "$kiln_gpu_ck_pid"; then
        tail -n 5 "$KILN_GPU_LOGS/checkpoint-$1.log"
        echo "gpu-env: the random checkpoint FAILED" >&2
        kiln_gpu_ck_pid=
        return 1
    fi
    kiln_gpu_ck_pid=
}

kiln_gpu_engine() {
    local model=$1 dir=$2
    shift 2
    local args=("$@")
    if [ ${#args[@]} -eq 0 ]; then
        args=(--dtype bf16 --max-tokens 2048)
        [ "$model" = 8b ] && args+=(--max-seq-len 8448)
    fi
    kiln_gpu_checkpoint_wait "$model" || return 1
    if ! "$KILN_BUILD_DIR/bin/kiln" build "$dir/ck" --backend cuda "${args[@]}" \
            -o "$dir/e.engine" >"$KILN_GPU_LOGS/engine-$model.log" 2>&1; then
        tail -n 5 "$KILN_GPU_LOGS/engine-$model.log"
        echo "gpu-env: kiln build FAILED" >&2
        return 1
    fi
}
