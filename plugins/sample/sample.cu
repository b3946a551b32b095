/* kiln/Sample on the GPU: one block per sequence, after a first pass
 * (sample_scan_kernel, many blocks a row) that summarizes each row
 * without penalties for the greedy choice and the candidate count.
 *
 * A row with a state slot first updates the slot's history (sample.h)
 * and, when it has penalties, writes its penalized logits to the workspace
 * with the CPU's float operations (no contraction), and samples from them.
 * Greedy rows take the argmax (lowest id on ties, as the CPU sampler).
 * Sampled rows order candidates by a 64-bit key, the tempered logit's
 * order-preserving bits then the complemented id, so that key order is the
 * CPU sampler's order (descending logit, ascending id on ties):
 * - top-k up to SAMPLE_SMALL = 512 (llama.cpp's and HF's defaults are 40 and 50):
 *   a radix select finds the k-th key, the k survivors are sorted in shared
 *   memory and one thread runs the CPU sampler's arithmetic over them
 *   (probabilities, top-p, min-p, the draw in that order);
 * - otherwise every probability goes to the workspace, top-p finds its
 *   cut-off key by bisection on the mass above a key, and the draw walks the
 *   survivors in id order: the same distribution as the CPU's, not always
 *   the same token for the same uniform.
 * Reductions are CUB's block reductions (fixed order), histograms count
 * integers: a row's result never depends on timing. Launches only. */
#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"
#include "sample/sample.h"

#define SAMPLE_THREADS 512
#define SAMPLE_SMALL SAMPLE_THREADS /* top-k sets sorted in shared memory: one key per thread */

struct sample_argmax {
    float v;
    int32_t i;
};

struct sample_argmax_op {
    __device__ sample_argmax operator()(const sample_argmax &a, const sample_argmax &b) const
    {
        if (b.i < 0)
            return a;
        if (a.i < 0)
            return b;
        return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
    }
};

struct sample_max_op {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

typedef cub::BlockReduce<sample_argmax, SAMPLE_THREADS> reduce_am;
typedef cub::BlockReduce<double, SAMPLE_THREADS> reduce_d;
typedef cub::BlockReduce<float, SAMPLE_THREADS> reduce_f;
typedef cub::BlockReduce<int, SAMPLE_THREADS> reduce_i;
typedef cub::BlockScan<double, SAMPLE_THREADS> scan_d;
typedef cub::BlockRadixSort<unsigned long long, SAMPLE_THREADS, 1> sort_k;

union sample_smem {
    reduce_am::TempStorage ram;
    reduce_d::TempStorage rd;
    reduce_f::TempStorage rf;
    reduce_i::TempStorage ri;
    scan_d::TempStorage sd;
    sort_k::TempStorage sk;
};

/* Float bits whose unsigned order is the float order. */
__device__ __forceinline__ uint32_t sample_ordered(float f)
{
    uint32_t u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float sample_unordered(uint32_t o)
{
    return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

/* s + 0.0f turns -0 into +0: the CPU compares them equal (a tie, broken
 * by id), so their keys must be equal too. */
__device__ __forceinline__ unsigned long long sample_key(float s, int32_t id)
{
    return (unsigned long long)sample_ordered(s + 0.0f) << 32 | (uint32_t)(0xffffffffu - (uint32_t)id);
}

__device__ __forceinline__ int32_t sample_key_id(unsigned long long k) { return (int32_t)(0xffffffffu - (uint32_t)k); }

/* The k-th largest key among the row's candidates (k >= 1): 8 passes of
 * 8-bit digits from the top, each a shared-memory histogram of the keys
 * that match the digits found so far. */
__device__ unsigned long long sample_select(const float *row, int32_t V, float inv_t, int32_t k, int *hist,
                                            unsigned long long *found, int *need)
{
    unsigned long long prefix = 0, mask = 0;
    if (threadIdx.x == 0)
        *need = k;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x)
            hist[i] = 0;
        __syncthreads();
        for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
            float x = row[i];
            if (x == -INFINITY)
                continue;
            unsigned long long key = sample_key(x * inv_t, i);
            if ((key & mask) == prefix)
                atomicAdd(&hist[(key >> shift) & 255], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int left = *need, d = 255;
            for (; d > 0 && hist[d] < left; d--)
                left -= hist[d];
            *need = left;
            *found = prefix | (unsigned long long)d << shift;
        }
        __syncthreads();
        prefix = *found;
        mask |= 255ull << shift;
        __syncthreads();
    }
    return prefix;
}

/* One logit under the penalties: kiln_sampler_penalty's operations. */
__device__ __forceinline__ float sample_penalize(float x, int32_t v, float rep, float presence, float frequency)
{
    if ((v & 1) && rep > 0.0f && rep != 1.0f)
        x = x > 0.0f ? __fdiv_rn(x, rep) : __fmul_rn(x, rep);
    int32_t count = v >> 1;
    if (count > 0 && (presence != 0.0f || frequency != 0.0f))
        x = __fsub_rn(x, __fadd_rn(presence, __fmul_rn(frequency, (float)count)));
    return x;
}

/* The slot's history: restart at position 0, then mark the fed tokens. */
__device__ void sample_track_row(const sample_args &a, int32_t s, int32_t *st, int32_t n_prompt)
{
    if (s + 1 >= a.Q)
        return;
    const int32_t t0 = a.qstart[s], t1 = a.qstart[s + 1];
    if (t0 < 0 || t1 > a.T || t0 >= t1)
        return;
    if (a.positions[t0] == 0)
        for (int32_t i = threadIdx.x; i < a.V; i += blockDim.x)
            st[i] = 0;
    __syncthreads();
    for (int32_t t = t0 + (int32_t)threadIdx.x; t < t1; t += blockDim.x) {
        int32_t tok = a.tokens[t];
        if (tok < 0 || tok >= a.V)
            continue;
        atomicOr(&st[tok], 1);
        if (a.positions[t] >= n_prompt)
            atomicAdd(&st[tok], 2);
    }
    __syncthreads();
}

/* A row's first-pass summary over one part of the vocabulary: its argmax
 * (lowest id on ties), the count of candidates (logits above -inf) and
 * their largest tempered logit. */
struct sample_part {
    sample_argmax am;
    int32_t n;
    float m;
};

/* Parts a row is cut into by sample_scan_kernel (0: no first pass). A
 * row's parts live at the start of its probability area of the workspace
 * (8 bytes per entry), which is written only after they are read; short
 * vocabularies take one pass. The parts are there to fill the GPU with a
 * few rows: with S rows they aim at about 512 blocks, and from 256 rows
 * on sample_kernel's blocks, a row each, fill it themselves (at 1,024
 * rows of a 128k vocabulary the 62 parts a row took 686 us under ncu,
 * 0.18 of the memory's bandwidth). */
static int32_t sample_parts(int32_t V, int32_t S)
{
    if (V < 8192 || S >= 256)
        return 0;
    const int32_t most = V / 2048 < 64 ? V / 2048 : 64, fill = (512 + S - 1) / S;
    return fill < 2 ? 0 : fill < most ? fill : most;
}

/* Whether row s is sampled from penalized logits, which only the main
 * kernel computes (after updating the slot's history). */
__device__ __forceinline__ int sample_row_penalized(const sample_args &a, int32_t s)
{
    const int32_t slot = a.seq[(size_t)s * SAMPLE_SEQ + 2];
    return slot >= 0 && slot < a.slots && sample_has_penalty(a.params + (size_t)s * (size_t)a.P);
}

/* Grid: x = part, y = row. A block reads its part of the row with every
 * thread's loads in flight at once: the row of a 128k vocabulary takes one
 * memory latency over 64 blocks instead of 32 over one. */
__global__ void __launch_bounds__(SAMPLE_THREADS) sample_scan_kernel(const sample_args a, int32_t parts)
{
    KTL_SCOPE(0);
    __shared__ sample_smem tmp;
    kcu_after_prior();
    const int32_t s = blockIdx.y, V = a.V;
    if (sample_row_penalized(a, s))
        return;
    const float *row = a.logits + (size_t)s * (size_t)V;
    const float temperature = a.params[(size_t)s * (size_t)a.P];
    const float inv_t = temperature > 0.0f ? 1.0f / temperature : 1.0f;
    const int32_t per = (V + parts - 1) / parts, lo = (int32_t)blockIdx.x * per, hi = min(V, lo + per);
    constexpr int U = 4;
    float xs[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int32_t i = lo + (int32_t)threadIdx.x + u * SAMPLE_THREADS;
        xs[u] = i < hi ? row[i] : -INFINITY;
    }
    sample_argmax best = {-INFINITY, -1};
    int n_local = 0;
    float m_local = -INFINITY;
    for (int32_t base = lo;; base += U * SAMPLE_THREADS) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int32_t i = base + (int32_t)threadIdx.x + u * SAMPLE_THREADS;
            if (i < hi) {
                best = sample_argmax_op()(best, sample_argmax{xs[u], i});
                if (xs[u] != -INFINITY) {
                    n_local++;
                    m_local = fmaxf(m_local, xs[u] * inv_t);
                }
            }
        }
        if (base + U * SAMPLE_THREADS >= hi)
            break;
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int32_t i = base + U * SAMPLE_THREADS + (int32_t)threadIdx.x + u * SAMPLE_THREADS;
            xs[u] = i < hi ? row[i] : -INFINITY;
        }
    }
    sample_argmax am = reduce_am(tmp.ram).Reduce(best, sample_argmax_op());
    __syncthreads();
    int n = reduce_i(tmp.ri).Sum(n_local);
    __syncthreads();
    float m = reduce_f(tmp.rf).Reduce(m_local, sample_max_op());
    if (threadIdx.x == 0) {
        sample_part *out = (sample_part *)((float *)a.workspace + (size_t)s * (size_t)V * 2);
        out[blockIdx.x] = sample_part{am, n, m};
    }
}

__global__ void __launch_bounds__(SAMPLE_THREADS) sample_kernel(const sample_args a, int32_t parts)
{
    KTL_SCOPE(0);
    __shared__ sample_smem tmp;
    __shared__ int hist[256];
    __shared__ unsigned long long found;
    __shared__ int need;
    __shared__ float fshare;
    __shared__ double dshare;
    __shared__ unsigned long long keys[SAMPLE_SMALL];
    __shared__ float probs[SAMPLE_SMALL];
    kcu_after_prior();
    const int32_t s = blockIdx.x, V = a.V;
    const float *row = a.logits + (size_t)s * (size_t)V;
    const float *pr = a.params + (size_t)s * (size_t)a.P;
    const int32_t *sq = a.seq + (size_t)s * SAMPLE_SEQ;
    int32_t *ids = a.ids;
    /* The workspace: 8 bytes per entry for probabilities, then 4 for
     * penalized logits. */
    float *p = (float *)a.workspace + (size_t)s * (size_t)V * 2;
    const float temperature = pr[0], top_p = pr[2], min_p = pr[3];
    const int32_t slot = sq[2];
    if (slot >= 0 && slot < a.slots) {
        int32_t *st = a.state + (size_t)slot * (size_t)V;
        sample_track_row(a, s, st, sq[3]);
        if (sample_has_penalty(pr)) {
            float *pen = (float *)a.workspace + (size_t)a.S * (size_t)V * 2 + (size_t)s * (size_t)V;
            for (int32_t i = threadIdx.x; i < V; i += blockDim.x)
                pen[i] = sample_penalize(row[i], st[i], pr[4], pr[5], pr[6]);
            __syncthreads();
            row = pen;
        }
    }

    /* Greedy, and the fallback of a row without candidates. */
    sample_argmax best = {-INFINITY, -1};
    int n_local = 0;
    float m_local = -INFINITY;
    const float inv_t = temperature > 0.0f ? 1.0f / temperature : 1.0f;
    /* Eight loads in flight per thread, in increasing id order (a plain
     * strided loop waited on each: 108 us for a 128k vocabulary), unless
     * sample_scan_kernel summarized the row already. */
    constexpr int U = 8;
    int32_t i = threadIdx.x;
    if (parts > 0 && row == a.logits + (size_t)s * (size_t)V) {
        if (i < parts) {
            const sample_part pt = ((const sample_part *)p)[i];
            best = pt.am, n_local = pt.n, m_local = pt.m;
        }
        i = V; /* nothing left to scan */
    }
    for (; i + (U - 1) * (int32_t)blockDim.x < V; i += U * (int32_t)blockDim.x) {
        float xs[U];
#pragma unroll
        for (int u = 0; u < U; u++)
            xs[u] = row[i + u * (int32_t)blockDim.x];
#pragma unroll
        for (int u = 0; u < U; u++) {
            best = sample_argmax_op()(best, sample_argmax{xs[u], i + u * (int32_t)blockDim.x});
            if (xs[u] != -INFINITY) {
                n_local++;
                m_local = fmaxf(m_local, xs[u] * inv_t);
            }
        }
    }
    for (; i < V; i += blockDim.x) {
        float x = row[i];
        best = sample_argmax_op()(best, sample_argmax{x, i});
        if (x != -INFINITY) {
            n_local++;
            m_local = fmaxf(m_local, x * inv_t);
        }
    }
    sample_argmax am = reduce_am(tmp.ram).Reduce(best, sample_argmax_op());
    __syncthreads();
    int n = reduce_i(tmp.ri).Sum(n_local);
    __syncthreads();
    float m = reduce_f(tmp.rf).Reduce(m_local, sample_max_op());
    if (threadIdx.x == 0) {
        need = n;
        fshare = m;
        ids[s] = am.i < 0 ? 0 : am.i;
    }
    __syncthreads();
    n = need;
    m = fshare;
    if (!(temperature > 0.0f) || n == 0)
        return;
    const int32_t top_k = sample_top_k(pr[1], V);
    const int32_t k = top_k > 0 && top_k < n ? top_k : n;
    const double u = (double)((unsigned long long)(uint32_t)sq[0] << 32 | (uint32_t)sq[1]) * 0x1.0p-53;
    __syncthreads();

    unsigned long long kth = k < n ? sample_select(row, V, inv_t, k, hist, &found, &need) : 0;
    if (k <= SAMPLE_SMALL) {
        /* Gather the k survivors, sort them by key, and run the CPU's loop. */
        if (threadIdx.x == 0)
            need = 0;
        __syncthreads();
        for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
            float x = row[i];
            if (x == -INFINITY)
                continue;
            unsigned long long key = sample_key(x * inv_t, i);
            if (key >= kth)
                keys[atomicAdd(&need, 1)] = key;
        }
        __syncthreads();
        unsigned long long mine[1] = {threadIdx.x < (unsigned)k ? keys[threadIdx.x] : 0ull};
        sort_k(tmp.sk).SortDescending(mine);
        __syncthreads();
        keys[threadIdx.x] = mine[0];
        __syncthreads();
        const float max = sample_unordered((uint32_t)(keys[0] >> 32));
        if (threadIdx.x < (unsigned)k)
            probs[threadIdx.x] = expf(sample_unordered((uint32_t)(keys[threadIdx.x] >> 32)) - max);
        __syncthreads();
        if (threadIdx.x != 0)
            return;
        int32_t kept = k;
        double sum = 0.0;
        for (int32_t i = 0; i < kept; i++)
            sum += probs[i];
        if (top_p > 0.0f && top_p < 1.0f) {
            double cum = 0.0;
            int32_t keep = 0;
            while (keep < kept && cum < (double)top_p * sum)
                cum += probs[keep++];
            kept = keep > 0 ? keep : 1;
            sum = cum;
        }
        if (min_p > 0.0f) {
            float threshold = min_p * probs[0];
            int32_t keep = 0;
            double mass = 0.0;
            for (int32_t i = 0; i < kept; i++)
                if (probs[i] >= threshold) {
                    keys[keep] = keys[i];
                    probs[keep] = probs[i];
                    mass += probs[keep++];
                }
            kept = keep;
            sum = mass;
        }
        double cum = 0.0;
        int32_t pick = kept - 1;
        for (int32_t i = 0; i < kept; i++) {
            cum += (float)(probs[i] / sum);
            if (u < cum) {
                pick = i;
                break;
            }
        }
        ids[s] = sample_key_id(keys[pick]);
        return;
    }

    /* Large sets: probabilities in the workspace (0 for those out of top-k). */
    double z_local = 0.0;
    for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
        float x = row[i];
        float q = 0.0f;
        if (x != -INFINITY && sample_key(x * inv_t, i) >= kth)
            q = expf(x * inv_t - m);
        p[i] = q;
        z_local += q;
    }
    double z = reduce_d(tmp.rd).Sum(z_local);
    if (threadIdx.x == 0)
        dshare = z;
    __syncthreads();
    z = dshare;
    unsigned long long cut = 0;
    if (top_p > 0.0f && top_p < 1.0f) {
        /* The largest key x with mass(key >= x) >= top_p * z: the last
         * token the CPU's cumulative loop keeps. */
        const double target = (double)top_p * z;
        for (int bit = 63; bit >= 0; bit--) {
            unsigned long long x = cut | 1ull << bit;
            double local = 0.0;
            for (int32_t i = threadIdx.x; i < V; i += blockDim.x)
                if (p[i] > 0.0f && sample_key(row[i] * inv_t, i) >= x)
                    local += p[i];
            __syncthreads();
            double mass = reduce_d(tmp.rd).Sum(local);
            if (threadIdx.x == 0)
                dshare = mass;
            __syncthreads();
            if (dshare >= target)
                cut = x;
        }
    }
    /* top-p and min-p cut, then the mass of what is left. */
    const float threshold = min_p > 0.0f ? min_p : 0.0f;
    const int32_t chunk = (V + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int32_t lo = min((int32_t)threadIdx.x * chunk, V), hi = min(lo + chunk, V);
    double own = 0.0;
    for (int32_t i = lo; i < hi; i++) {
        if (p[i] > 0.0f && (sample_key(row[i] * inv_t, i) < cut || p[i] < threshold))
            p[i] = 0.0f;
        own += p[i];
    }
    __syncthreads();
    double before, total;
    scan_d(tmp.sd).ExclusiveSum(own, before, total);
    /* The draw, in id order: the thread whose chunk holds u * total walks it. */
    const double target = u * total;
    if (own > 0.0 && before <= target && target < before + own) {
        double cum = before;
        int32_t pick = -1;
        for (int32_t i = lo; i < hi && pick < 0; i++) {
            cum += p[i];
            if (p[i] > 0.0f && target < cum)
                pick = i;
        }
        for (int32_t i = hi - 1; pick < 0 && i >= lo; i--)
            if (p[i] > 0.0f)
                pick = i;
        ids[s] = pick;
    } else if (own > 0.0 && target >= total && before + own >= total) {
        /* Rounding left the target past the end: the last survivor. */
        for (int32_t i = hi - 1; i >= lo; i--)
            if (p[i] > 0.0f) {
                ids[s] = i;
                break;
            }
    }
}

/* The logprob outputs of a row that asks for them (sample.c defines them),
 * after sample_kernel has chosen its id (stream order): the log-softmax
 * over the penalized logits sample_kernel used (its workspace copy when the
 * row has penalties), and the n most likely ids found by the radix select
 * over untempered keys and sorted in shared memory. */
__global__ void __launch_bounds__(SAMPLE_THREADS) sample_logprob_kernel(const sample_args a)
{
    KTL_SCOPE(0);
    __shared__ sample_smem tmp;
    __shared__ int hist[256];
    __shared__ unsigned long long found;
    __shared__ int need;
    __shared__ float fshare;
    __shared__ double dshare;
    __shared__ unsigned long long keys[SAMPLE_SMALL];
    const int32_t s = blockIdx.x, V = a.V, K = a.top;
    const float *pr = a.params + (size_t)s * (size_t)a.P;
    const int32_t *sq = a.seq + (size_t)s * SAMPLE_SEQ;
    int32_t n = pr[SAMPLE_PARAMS] >= 0.0f ? (int32_t)pr[SAMPLE_PARAMS] : -1;
    if (n > K)
        n = K;
    for (int32_t k = threadIdx.x; k < K; k += blockDim.x) {
        a.top_ids[(size_t)s * K + k] = -1;
        a.top_logprobs[(size_t)s * K + k] = __int_as_float(0x7fc00000);
    }
    if (threadIdx.x == 0)
        a.logprob[s] = __int_as_float(0x7fc00000);
    if (n < 0)
        return;
    const float *row = a.logits + (size_t)s * (size_t)V;
    if (sq[2] >= 0 && sq[2] < a.slots && sample_has_penalty(pr))
        row = (const float *)a.workspace + (size_t)a.S * (size_t)V * 2 + (size_t)s * (size_t)V;
    float m_local = -INFINITY;
    int n_local = 0;
    for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
        m_local = fmaxf(m_local, row[i]);
        n_local += row[i] != -INFINITY;
    }
    float m = reduce_f(tmp.rf).Reduce(m_local, sample_max_op());
    if (threadIdx.x == 0)
        fshare = m;
    __syncthreads();
    m = fshare;
    int cnt = reduce_i(tmp.ri).Sum(n_local);
    if (threadIdx.x == 0)
        need = cnt;
    __syncthreads();
    cnt = need;
    double z_local = 0.0;
    for (int32_t i = threadIdx.x; i < V; i += blockDim.x)
        z_local += exp((double)row[i] - (double)m);
    double z = reduce_d(tmp.rd).Sum(z_local);
    if (threadIdx.x == 0)
        dshare = z;
    __syncthreads();
    const double lse = (double)m + log(dshare);
    if (threadIdx.x == 0)
        a.logprob[s] = (float)((double)row[a.ids[s]] - lse);
    if (n == 0)
        return;
    __syncthreads();
    const unsigned long long kth = n < cnt ? sample_select(row, V, 1.0f, n, hist, &found, &need) : 0;
    if (threadIdx.x == 0)
        need = 0;
    __syncthreads();
    for (int32_t i = threadIdx.x; i < V; i += blockDim.x) {
        float x = row[i];
        if (x == -INFINITY)
            continue;
        unsigned long long key = sample_key(x, i);
        if (key >= kth)
            keys[atomicAdd(&need, 1)] = key;
    }
    __syncthreads();
    const int got = need < n ? need : n;
    unsigned long long mine[1] = {threadIdx.x < (unsigned)got ? keys[threadIdx.x] : 0ull};
    sort_k(tmp.sk).SortDescending(mine);
    if ((int)threadIdx.x < got) {
        int32_t id = sample_key_id(mine[0]);
        a.top_ids[(size_t)s * K + threadIdx.x] = id;
        a.top_logprobs[(size_t)s * K + threadIdx.x] = (float)((double)row[id] - lse);
    }
}

extern "C" int kiln_sample_cuda(const sample_args *a, void *stream)
{
    const int32_t parts = sample_parts(a->V, a->S);
    if (parts > 0) {
        cudaError_t e = kcu_launch_cfg(sample_scan_kernel, dim3((unsigned)parts, (unsigned)a->S), dim3(SAMPLE_THREADS),
                                       (cudaStream_t)stream, *a, parts);
        if (e != cudaSuccess)
            return (int)e;
    }
    /* both with programmatic dependent launch (each waits on the previous
     * kernel first); the logprob pass is an ordinary launch after them */
    cudaError_t e =
        kcu_launch_cfg(sample_kernel, dim3((unsigned)a->S), dim3(SAMPLE_THREADS), (cudaStream_t)stream, *a, parts);
    if (e != cudaSuccess)
        return (int)e;
    if (a->top > 0)
        sample_logprob_kernel<<<a->S, SAMPLE_THREADS, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}
