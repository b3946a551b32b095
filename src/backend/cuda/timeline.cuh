/* A timeline of kernels, for a machine without nsys (the GPU machine has
 * none): configured with -DKILN_CUDA_TIMELINE=ON, every kernel that opens
 * with KTL_SCOPE has thread 0 of each of its blocks record when the block
 * started, when its wait on the previous kernel returned (kcu_after_prior,
 * kat_wait_prior) and when it ended, in %globaltimer nanoseconds (one clock
 * for all SMs), with the block's SM. Records go into a ring per .cu file
 * (the last KTL_CAP of them); when the CUDA device is destroyed and
 * KILN_TIMELINE names a file, every ring is written to it as text, one
 * block a line. tools/timeline.py turns that into launches, their order
 * and the gaps between them (tools/gpu-timeline.sh runs it all on the GPU
 * machine). Each ring takes KTL_CAP records of 48 bytes (48 MB of device
 * memory a .cu file), the stamps 4-7% of a decode step (H200). In a
 * normal build all of it is nothing. */
#ifndef KILN_BACKEND_CUDA_TIMELINE_CUH
#define KILN_BACKEND_CUDA_TIMELINE_CUH

#ifdef KILN_CUDA_TIMELINE

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" void kiln_cuda_timeline_add(const char *module, int (*dump)(FILE *f, const char *module));

#define KTL_MARKS 4
struct ktl_rec {
    unsigned long long t0; /* the block's start */
    unsigned wait, end;    /* ns after t0 (wait 0: the block never waited) */
    unsigned tag;          /* the kernel: __LINE__ of its KTL_SCOPE << 16 | its discriminator */
    unsigned block, smid, grid;
    unsigned mark[KTL_MARKS]; /* ns after t0 at each ktl_mark(i), 0 where not reached */
};

#define KTL_CAP (1u << 20)
static __device__ ktl_rec ktl_ring[KTL_CAP];
static __device__ unsigned long long ktl_count;

__device__ __forceinline__ unsigned long long ktl_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Where thread 0 keeps the time its wait returned: shared, so that the
 * wait helpers can stamp it without the kernel passing anything. */
__device__ __forceinline__ unsigned long long &ktl_wait_slot()
{
    __shared__ unsigned long long s;
    return s;
}

__device__ __forceinline__ void ktl_waited()
{
    if ((threadIdx.x | threadIdx.y | threadIdx.z) == 0)
        ktl_wait_slot() = ktl_now();
}

/* Points inside a kernel that thread 0 passes, for a closer look. */
__device__ __forceinline__ unsigned long long *ktl_mark_slots()
{
    __shared__ unsigned long long s[KTL_MARKS];
    return s;
}

__device__ __forceinline__ void ktl_mark(int i)
{
    if ((threadIdx.x | threadIdx.y | threadIdx.z) == 0)
        ktl_mark_slots()[i] = ktl_now();
}

struct ktl_scope {
    unsigned long long t0;
    unsigned tag;
    __device__ explicit ktl_scope(unsigned tag_) : t0(ktl_now()), tag(tag_)
    {
        if ((threadIdx.x | threadIdx.y | threadIdx.z) == 0) {
            ktl_wait_slot() = 0;
            for (int i = 0; i < KTL_MARKS; i++)
                ktl_mark_slots()[i] = 0;
        }
    }
    __device__ ~ktl_scope()
    {
        if (threadIdx.x | threadIdx.y | threadIdx.z)
            return;
        const unsigned long long te = ktl_now(), tw = ktl_wait_slot();
        unsigned smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        ktl_rec r;
        r.t0 = t0;
        r.wait = tw ? (unsigned)(tw - t0) : 0u;
        r.end = (unsigned)(te - t0);
        r.tag = tag;
        r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        r.smid = smid;
        r.grid = gridDim.x * gridDim.y * gridDim.z;
        for (int i = 0; i < KTL_MARKS; i++) {
            const unsigned long long m = ktl_mark_slots()[i];
            r.mark[i] = m ? (unsigned)(m - t0) : 0u;
        }
        ktl_ring[atomicAdd(&ktl_count, 1ull) % KTL_CAP] = r;
    }
};

#define KTL_CAT2(a, b) a##b
#define KTL_CAT(a, b) KTL_CAT2(a, b)
/* First statement of a kernel; `extra` (16 bits kept) tells launches of
 * one kernel apart, e.g. a matrix's depth. */
#define KTL_SCOPE(extra) \
    ktl_scope KTL_CAT(ktl_scope_, __LINE__)(((unsigned)__LINE__ << 16) | ((unsigned)(extra)&0xffffu))

/* The ring of this .cu file as text: module tag block smid grid t0 wait
 * end mark0..3. */
static int ktl_dump(FILE *f, const char *module)
{
    unsigned long long n = 0;
    if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpyFromSymbol(&n, ktl_count, sizeof n) != cudaSuccess)
        return -1;
    const unsigned long long keep = n < KTL_CAP ? n : KTL_CAP;
    ktl_rec *r = (ktl_rec *)malloc(KTL_CAP * sizeof *r);
    if (!r || cudaMemcpyFromSymbol(r, ktl_ring, KTL_CAP * sizeof *r) != cudaSuccess) {
        free(r);
        return -1;
    }
    for (unsigned long long i = n - keep; i < n; i++) {
        const ktl_rec &x = r[i % KTL_CAP];
        fprintf(f, "%s %u %u %u %u %llu %u %u %u %u %u %u\n", module, x.tag, x.block, x.smid, x.grid, x.t0, x.wait,
                x.end, x.mark[0], x.mark[1], x.mark[2], x.mark[3]);
    }
    free(r);
    return 0;
}

__attribute__((used)) static int ktl_registered = (kiln_cuda_timeline_add(__BASE_FILE__, ktl_dump), 1);

#else

#define KTL_SCOPE(extra) ((void)0)
__device__ __forceinline__ void ktl_waited() {}
__device__ __forceinline__ void ktl_mark(int) {}

#endif
#endif
