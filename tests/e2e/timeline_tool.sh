#!/usr/bin/env bash
# tools/timeline.py (the kernel timeline's summary, docs/design.md section 7)
# on a trace built here with known times: three kernels a step, a step every
# 100 us; each kernel's block records sit where a -DKILN_CUDA_TIMELINE=ON
# build would put them (the KTL_SCOPE line of the kernel in its .cu file),
# so the names come from the sources as they do on the GPU machine.
set -euo pipefail
src=${KILN_SOURCE_DIR:?KILN_SOURCE_DIR is not set}
build=${KILN_BUILD_DIR:?KILN_BUILD_DIR is not set}
# line FILE KERNEL: the KTL_SCOPE line of KERNEL's definition (the first
# after its name followed by "("), so kernels added above it move nothing
line() { awk -v n="$2" '$0 ~ "(^|[ )])" n "\\(" {f=1} f && /KTL_SCOPE/ {print NR; exit}' "$src/$1"; }
gemv=$(line plugins/fusedmm/fusedmm_cuda.cu fmm_gemv_kernel)
pipe=$(line plugins/attention/attention_cuda.cu kat_pipe)
gather=$(line src/backend/cuda/cuda_movement.cu kcu_gather_kernel)
[ -n "$gemv" ] && [ -n "$pipe" ] && [ -n "$gather" ] || { echo "FAIL: a kernel's KTL_SCOPE line was not found"; exit 1; }
trace=$build/timeline_tool.txt
# per step s (ns from s * 100,000): fmm_gemv (4 blocks) starts 0, waits 2000,
# ends 10000; kat_pipe (2 blocks) 9000 / 11000 / 15000; kcu_gather (1 block)
# 14000 / 16000 / 20000. So a step is 100 us: kat_pipe adds 5 us (handoff 1,
# run 4), kcu_gather 5 us (1, 4), fmm_gemv the other 90 (handoff 82, run 8).
python3 - "$trace" "$gemv" "$pipe" "$gather" <<'EOF'
import sys
out, gemv, pipe, gather = sys.argv[1], *map(int, sys.argv[2:])
kernels = [("/x/plugins/fusedmm/fusedmm_cuda.cu", gemv << 16 | 4096, 4, 0),
           ("/x/plugins/attention/attention_cuda.cu", pipe << 16, 2, 9000),
           ("/x/src/backend/cuda/cuda_movement.cu", gather << 16, 1, 14000)]
with open(out, "w") as f:
    for s in range(12):
        for module, tag, grid, at in kernels:
            for b in range(grid):
                t0 = 1_000_000 + s * 100_000 + at
                f.write("%s %d %d %d %d %d %d %d 0 0 0 0\n" % (module, tag, b, b, grid, t0, 2000, 6000 if at else 10000))
EOF
out=$(python3 "$src/tools/timeline.py" "$trace" --steps 8)
echo "$out"
fail=0
expect() { # expect REGEX WHY
  grep -Eq "$1" <<<"$out" || { echo "FAIL: $2 (no line matching: $1)"; fail=1; }
}
expect '^step: median 100\.0 us \(min 100\.0, max 100\.0\) over 8 steps' "a step is 100 us"
expect '^kat_pipe/0 +2 +1 +5\.00 +5\.0 +1\.00 +4\.00 +2\.00' "kat_pipe adds 5 us, handoff 1, run 4, early 2"
expect '^kcu_gather_kernel/0 +1 +1 +5\.00 +5\.0 +1\.00 +4\.00 +2\.00' "kcu_gather adds 5 us"
expect '^fmm_gemv_kernel/4096 +4 +1 +90\.00 +90\.0 +82\.00 +8\.00 +2\.00' "fmm_gemv adds the other 90 us"
expect '^\(sum\) +100\.0' "the kernels' shares add up to the step"
[ $fail = 0 ] && echo "ok: tools/timeline.py groups blocks into launches and steps and names the kernels from the sources"
exit $fail
