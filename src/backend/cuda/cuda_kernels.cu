/* The CUDA backend's kernels. Storage is f32, f16 or bf16 (integers where
 * the CPU backend takes them); arithmetic is f32 and follows the CPU
 * reference kernels op by op (same formulas, same NaN rules, same rounding
 * on store). Every kernel is a grid-stride loop over 64-bit indices, so any
 * tensor size works with a bounded grid.
 *
 * Template instantiations are kept few (nvcc is slow on CI's two cores):
 * the vectorized fused kernel per float dtype (with and without the saved
 * register) and the copies per element size; everything else switches on
 * dtype at run time. Every kernel takes part in programmatic dependent
 * launch (kcu_after_prior, kcu_launch). */
#include "cuda_internal.h"
#include "kcu_device.cuh"

#include <kiln/network.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#define KCU_THREADS 256

/* Blocks for n work items: enough to fill the GPU several times over,
 * never more than the items need. */
static unsigned kcu_blocks(int64_t n, int32_t sms, int per_thread)
{
    int64_t want = (n + (int64_t)KCU_THREADS * per_thread - 1) / ((int64_t)KCU_THREADS * per_thread);
    int64_t cap = (int64_t)(sms > 0 ? sms : 132) * 8;
    if (want > cap)
        want = cap;
    return (unsigned)(want > 0 ? want : 1);
}

static int kcu_pdl = 1;

extern "C" void kcu_set_pdl(int32_t on) { kcu_pdl = on != 0; }

extern "C" int32_t kcu_pdl_enabled(void) { return kcu_pdl; }

/* One block size for every kernel here (see kcu_launch_cfg). */
template <typename... P, typename... A>
static cudaError_t kcu_launch(void (*kernel)(P...), unsigned blocks, cudaStream_t stream, A... args)
{
    return kcu_launch_cfg(kernel, dim3(blocks), dim3(KCU_THREADS), stream, args...);
}

__device__ __forceinline__ float kcu_load(const void *p, int t, int64_t i)
{
    switch (t) {
    case KILN_DTYPE_F32: return ((const float *)p)[i];
    case KILN_DTYPE_F16: return kcu_f16_f32(((const uint16_t *)p)[i]);
    case KILN_DTYPE_BF16: return kcu_bf16_f32(((const uint16_t *)p)[i]);
    case KILN_DTYPE_I8: return (float)((const int8_t *)p)[i];
    case KILN_DTYPE_U8: return (float)((const uint8_t *)p)[i];
    case KILN_DTYPE_I32: return (float)((const int32_t *)p)[i];
    case KILN_DTYPE_I64: return (float)((const int64_t *)p)[i];
    case KILN_DTYPE_BOOL: return ((const uint8_t *)p)[i] ? 1.0f : 0.0f;
    default: return __int_as_float(0x7fc00000);
    }
}

/* Float to integer: toward zero, saturating, NaN to 0 (kiln_store_f32). */
__device__ __forceinline__ int64_t kcu_sat(float v, float lo, float hi)
{
    if (v != v)
        return 0;
    if (v <= lo)
        return (int64_t)lo;
    if (v >= hi)
        return (int64_t)hi;
    return (int64_t)v;
}

__device__ __forceinline__ void kcu_store(void *p, int t, int64_t i, float v)
{
    switch (t) {
    case KILN_DTYPE_F32: ((float *)p)[i] = v; break;
    case KILN_DTYPE_F16: ((uint16_t *)p)[i] = kcu_f32_f16(v); break;
    case KILN_DTYPE_BF16: ((uint16_t *)p)[i] = kcu_f32_bf16(v); break;
    case KILN_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)kcu_sat(v, -128.0f, 127.0f); break;
    case KILN_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)kcu_sat(v, 0.0f, 255.0f); break;
    case KILN_DTYPE_I32:
        /* 2^31 is exact in f32 but 2^31-1 is not: compare against 2^31. */
        if (v != v)
            ((int32_t *)p)[i] = 0;
        else if (v >= 2147483648.0f)
            ((int32_t *)p)[i] = INT32_MAX;
        else if (v <= -2147483648.0f)
            ((int32_t *)p)[i] = INT32_MIN;
        else
            ((int32_t *)p)[i] = (int32_t)v;
        break;
    case KILN_DTYPE_I64:
        if (v != v)
            ((int64_t *)p)[i] = 0;
        else if (v >= 9223372036854775808.0f)
            ((int64_t *)p)[i] = INT64_MAX;
        else if (v <= -9223372036854775808.0f)
            ((int64_t *)p)[i] = INT64_MIN;
        else
            ((int64_t *)p)[i] = (int64_t)v;
        break;
    case KILN_DTYPE_BOOL: ((uint8_t *)p)[i] = v != 0.0f; break;
    default: break;
    }
}

__device__ __forceinline__ int64_t kcu_load_int(const void *p, int t, int64_t i)
{
    switch (t) {
    case KILN_DTYPE_I8: return ((const int8_t *)p)[i];
    case KILN_DTYPE_U8: return ((const uint8_t *)p)[i];
    case KILN_DTYPE_I32: return ((const int32_t *)p)[i];
    case KILN_DTYPE_I64: return ((const int64_t *)p)[i];
    default: return ((const uint8_t *)p)[i] != 0;
    }
}

/* Wrapping store (integer arithmetic results, as in C and numpy). */
__device__ __forceinline__ void kcu_store_wrap(void *p, int t, int64_t i, int64_t v)
{
    switch (t) {
    case KILN_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)v; break;
    case KILN_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case KILN_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case KILN_DTYPE_I64: ((int64_t *)p)[i] = v; break;
    default: ((uint8_t *)p)[i] = v != 0; break;
    }
}

/* Saturating store (integer-to-integer casts, as kiln_convert). */
__device__ __forceinline__ void kcu_store_clamp(void *p, int t, int64_t i, int64_t v)
{
    switch (t) {
    case KILN_DTYPE_I8: ((int8_t *)p)[i] = (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v); break;
    case KILN_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v); break;
    case KILN_DTYPE_I32:
        ((int32_t *)p)[i] = (int32_t)(v < INT32_MIN ? INT32_MIN : v > INT32_MAX ? INT32_MAX : v);
        break;
    case KILN_DTYPE_I64: ((int64_t *)p)[i] = v; break;
    default: ((uint8_t *)p)[i] = v != 0; break;
    }
}

/* ---- the ops (formulas of cpu_elementwise.c) ---------------------------------------- */

__device__ __forceinline__ float kcu_binary(int op, float x, float y)
{
    switch (op) {
    case KILN_BINARY_ADD: return x + y;
    case KILN_BINARY_SUB: return x - y;
    case KILN_BINARY_MUL: return x * y;
    case KILN_BINARY_DIV: return x / y;
    case KILN_BINARY_POW: return powf(x, y);
    case KILN_BINARY_MAX: return x > y ? x : y;
    case KILN_BINARY_MIN: return x < y ? x : y;
    default: return 0.0f;
    }
}

__device__ __forceinline__ float kcu_unary(int op, float x)
{
    switch (op) {
    case KILN_UNARY_NEG: return -x;
    case KILN_UNARY_ABS: return fabsf(x);
    case KILN_UNARY_EXP: return expf(x);
    case KILN_UNARY_LOG: return logf(x);
    case KILN_UNARY_SQRT: return sqrtf(x);
    case KILN_UNARY_RSQRT: return 1.0f / sqrtf(x);
    case KILN_UNARY_TANH: return tanhf(x);
    case KILN_UNARY_SIGMOID: return 1.0f / (1.0f + expf(-x));
    case KILN_UNARY_RELU: return x > 0.0f ? x : 0.0f;
    case KILN_UNARY_GELU_ERF: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    case KILN_UNARY_GELU_TANH: {
        float e = expf(2.0f * 0.79788456080286536f * (x + 0.044715f * x * x * x));
        return 0.5f * x * (1.0f + (1.0f - 2.0f / (e + 1.0f)));
    }
    case KILN_UNARY_SILU: return x / (1.0f + expf(-x));
    default: return 0.0f;
    }
}

/* ---- elementwise: generic path ------------------------------------------------------ */

/* The register file lives in local memory here (dynamic indices); this
 * path serves broadcasts, odd dtypes and tails, the vectorized one below
 * serves bandwidth. */
__global__ void kcu_ew_kernel(const kcu_ew_args a)
{
    kcu_after_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = a.start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.count; i += stride) {
        int64_t off[KCU_MAX_INPUTS] = {0};
        int64_t rem = i;
        for (int d = a.rank - 1; d >= 0; d--) {
            int64_t c = rem % a.dims[d];
            rem /= a.dims[d];
            for (int k = 0; k < a.n_in; k++)
                off[k] += c * a.st[k][d];
        }
        float r[KCU_MAX_INPUTS + KCU_MAX_STEPS];
        for (int k = 0; k < a.n_in; k++)
            r[k] = kcu_load(a.in[k], a.in_dtype[k], off[k]);
        for (int s = 0; s < a.n_steps; s++) {
            const kcu_step st = a.steps[s];
            r[a.n_in + s] = st.is_binary ? kcu_binary(st.op, r[st.a], r[st.b]) : kcu_unary(st.op, r[st.a]);
        }
        kcu_store(a.out, a.out_dtype, i, r[a.n_in + a.n_steps - 1]);
    }
}

__global__ void kcu_ew_int_kernel(const kcu_ew_args a, int is_binary, int op)
{
    kcu_after_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = a.start + (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.count; i += stride) {
        int64_t off[2] = {0, 0};
        int64_t rem = i;
        for (int d = a.rank - 1; d >= 0; d--) {
            int64_t c = rem % a.dims[d];
            rem /= a.dims[d];
            off[0] += c * a.st[0][d];
            off[1] += c * a.st[1][d];
        }
        int64_t x = kcu_load_int(a.in[0], a.in_dtype[0], off[0]), v = 0;
        /* unsigned arithmetic wraps instead of being undefined */
        uint64_t ux = (uint64_t)x;
        if (is_binary) {
            int64_t y = kcu_load_int(a.in[1], a.in_dtype[1], off[1]);
            uint64_t uy = (uint64_t)y;
            switch (op) {
            case KILN_BINARY_ADD: v = (int64_t)(ux + uy); break;
            case KILN_BINARY_SUB: v = (int64_t)(ux - uy); break;
            case KILN_BINARY_MUL: v = (int64_t)(ux * uy); break;
            case KILN_BINARY_DIV: v = y == 0 ? 0 : y == -1 ? (int64_t)(0 - ux) : x / y; break;
            case KILN_BINARY_POW:
                if (y < 0) {
                    v = x == 1 ? 1 : x == -1 ? (y % 2 ? -1 : 1) : 0;
                } else {
                    uint64_t r = 1, base = ux;
                    for (; y; y >>= 1) {
                        if (y & 1)
                            r *= base;
                        base *= base;
                    }
                    v = (int64_t)r;
                }
                break;
            case KILN_BINARY_MAX: v = x > y ? x : y; break;
            case KILN_BINARY_MIN: v = x < y ? x : y; break;
            default: break;
            }
        } else {
            switch (op) {
            case KILN_UNARY_NEG: v = (int64_t)(0 - ux); break;
            case KILN_UNARY_ABS: v = x < 0 ? (int64_t)(0 - ux) : x; break;
            default: v = x > 0 ? x : 0; break; /* relu */
            }
        }
        kcu_store_wrap(a.out, a.out_dtype, i, v);
    }
}

/* ---- elementwise: vectorized path ---------------------------------------------------
 * Memory moves 16 bytes per load and store; the micro-program runs on all
 * lanes of one 16-byte vector at a time (4 f32 or 8 halves), so each
 * dispatch is paid once per vector. */

template <typename T> struct kcu_vec;
template <> struct kcu_vec<float> {
    enum { lanes = 4 };
    static __device__ __forceinline__ float one(const void *p) { return __ldg((const float *)p); }
    static __device__ __forceinline__ void widen(const uint4 &u, float *v)
    {
        v[0] = __uint_as_float(u.x);
        v[1] = __uint_as_float(u.y);
        v[2] = __uint_as_float(u.z);
        v[3] = __uint_as_float(u.w);
    }
    static __device__ __forceinline__ uint4 narrow(const float *v)
    {
        return make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
    }
};

/* 8 16-bit values in a uint4, element 2j in the low half of word j. The
 * store rounds pairs with the hardware's packed conversion (one
 * instruction per two lanes); it rounds to nearest even exactly as
 * kcu_f32_f16/kcu_f32_bf16, and differs only in a NaN's payload (the
 * canonical NaN), which no comparison looks at. */
__device__ __forceinline__ uint32_t kcu_pack_f16(float lo, float hi)
{
    __half2 h = __floats2half2_rn(lo, hi);
    uint32_t w;
    memcpy(&w, &h, sizeof w);
    return w;
}
__device__ __forceinline__ uint32_t kcu_pack_bf16(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    uint32_t w;
    memcpy(&w, &h, sizeof w);
    return w;
}

template <float (*W)(uint16_t), uint32_t (*P)(float, float)> struct kcu_vec16 {
    enum { lanes = 8 };
    static __device__ __forceinline__ float one(const void *p) { return W(__ldg((const unsigned short *)p)); }
    static __device__ __forceinline__ void widen(const uint4 &u, float *v)
    {
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
        _Pragma("unroll") for (int j = 0; j < 4; j++)
        {
            v[2 * j] = W((uint16_t)(w[j] & 0xffffu));
            v[2 * j + 1] = W((uint16_t)(w[j] >> 16));
        }
    }
    static __device__ __forceinline__ uint4 narrow(const float *v)
    {
        return make_uint4(P(v[0], v[1]), P(v[2], v[3]), P(v[4], v[5]), P(v[6], v[7]));
    }
};
template <> struct kcu_vec<__half> : kcu_vec16<kcu_f16_f32, kcu_pack_f16> {};
template <> struct kcu_vec<__nv_bfloat16> : kcu_vec16<kcu_bf16_f32, kcu_pack_bf16> {};

/* Rare or long ops as calls: inlined on every lane they would take the
 * registers the memory-bound common case needs. */
__device__ __noinline__ float kcu_unary_call(int op, float x) { return kcu_unary(op, x); }
__device__ __noinline__ float kcu_pow_call(float x, float y) { return powf(x, y); }

/* exp and division for the common activations. 16-bit results use the
 * hardware approximations: their error (a few f32 ulps) is far below half
 * an f16/bf16 ulp, so the stored value is the correctly computed one or
 * its neighbour, inside the op tests' one-ulp tolerance. f32 results keep
 * the accurate library functions, matching the CPU reference to 1e-5. */
template <bool FAST> __device__ __forceinline__ float kcu_exp(float x) { return FAST ? __expf(x) : expf(x); }
template <bool FAST> __device__ __forceinline__ float kcu_div(float x, float y)
{
    return FAST ? __fdividef(x, y) : x / y;
}

#define KCU_LANES_DO(expr)                                       \
    _Pragma("unroll") for (int e = 0; e < L; e++)                \
    {                                                            \
        float v = acc[e];                                        \
        acc[e] = (expr);                                         \
    }                                                            \
    break;

template <int L, bool FAST> __device__ __forceinline__ void kcu_unary_lanes(int op, float *acc)
{
    switch (op) {
    case KILN_UNARY_NEG: KCU_LANES_DO(-v)
    case KILN_UNARY_ABS: KCU_LANES_DO(fabsf(v))
    case KILN_UNARY_RELU: KCU_LANES_DO(v > 0.0f ? v : 0.0f)
    case KILN_UNARY_EXP: KCU_LANES_DO(kcu_exp<FAST>(v))
    case KILN_UNARY_SQRT: KCU_LANES_DO(sqrtf(v))
    case KILN_UNARY_RSQRT: KCU_LANES_DO(kcu_div<FAST>(1.0f, sqrtf(v)))
    case KILN_UNARY_SIGMOID: KCU_LANES_DO(kcu_div<FAST>(1.0f, 1.0f + kcu_exp<FAST>(-v)))
    case KILN_UNARY_SILU: KCU_LANES_DO(kcu_div<FAST>(v, 1.0f + kcu_exp<FAST>(-v)))
    default: KCU_LANES_DO(kcu_unary_call(op, v))
    }
}

/* acc = op(acc, y) for each lane; KCU_SWAPPED ops take op(y, acc). Y is a
 * lane array or one broadcast value. NaN rules of max/min depend on the
 * order, so the swapped forms are spelled out. */
#define KCU_Y(e) kcu_y(y, e)
__device__ __forceinline__ float kcu_y(const float *y, int e) { return y[e]; }
__device__ __forceinline__ float kcu_y(float y, int) { return y; }

template <int L, bool FAST, typename Y> __device__ __forceinline__ void kcu_binary_lanes(int op, float *acc, Y y)
{
#define KCU_BIN(OP, expr)                                        \
    case OP:                                                     \
        _Pragma("unroll") for (int e = 0; e < L; e++)            \
        {                                                        \
            float p = acc[e], q = KCU_Y(e);                      \
            acc[e] = (expr);                                     \
        }                                                        \
        break;                                                   \
    case OP | KCU_SWAPPED:                                       \
        _Pragma("unroll") for (int e = 0; e < L; e++)            \
        {                                                        \
            float p = KCU_Y(e), q = acc[e];                      \
            acc[e] = (expr);                                     \
        }                                                        \
        break;
    switch (op) {
        KCU_BIN(KILN_BINARY_ADD, p + q)
        KCU_BIN(KILN_BINARY_SUB, p - q)
        KCU_BIN(KILN_BINARY_MUL, p * q)
        KCU_BIN(KILN_BINARY_DIV, p / q)
        KCU_BIN(KILN_BINARY_POW, kcu_pow_call(p, q))
        KCU_BIN(KILN_BINARY_MAX, p > q ? p : q)
        KCU_BIN(KILN_BINARY_MIN, p < q ? p : q)
    default: break;
    }
#undef KCU_BIN
}

/* One-element input k: from the parameters when the host knew it. */
template <typename T> __device__ __forceinline__ float kcu_scalar(const kcu_fast_args &a, int k)
{
    return (a.scal_known >> k) & 1 ? a.scal[k] : kcu_vec<T>::one(a.in[k]);
}

/* Each thread takes two 16-byte vectors per pass (i and i + stride, both
 * coalesced), so one dispatch of the micro-program serves 8 f32 or 16
 * half lanes. Memory latency is hidden three ways: the lead input (the one
 * ops[0] loads) of the next pass is read into registers while this pass
 * computes, every full-size input two passes ahead is prefetched into L2,
 * and as many threads are resident as the registers allow: 4 blocks of
 * 256 per SM, 3 when the program needs the saved register (SV). */
template <typename T, bool SV>
__global__ void __launch_bounds__(KCU_THREADS, SV ? 3 : 4) kcu_fast_kernel(const kcu_fast_args a)
{
    constexpr int V = kcu_vec<T>::lanes, L = 2 * V;
    constexpr bool FAST = sizeof(T) == 2;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, n = a.nvec;
    const uint4 *lead = a.lead >= 0 ? (const uint4 *)a.in[a.lead] : NULL;
    kcu_after_prior(lead, a.out, n, a.n_ops);
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint4 c0 = make_uint4(0, 0, 0, 0), c1 = c0;
    if (lead && i < n) {
        c0 = __ldg(lead + i);
        c1 = __ldg(lead + (i + stride < n ? i + stride : i));
    }
    for (; i < n; i += 2 * stride) {
        /* the second vector, or the first again when past the end (its
         * result is then not stored) */
        const int has2 = i + stride < n;
        const int64_t j = has2 ? i + stride : i;
        if (i + 2 * stride < n)
            for (int k = 0; k < a.n_vec_in; k++) {
                const uint4 *p = (const uint4 *)a.in[a.vec_in[k]] + i + 2 * stride;
                asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
                if (i + 3 * stride < n)
                    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + stride));
            }
        float acc[L], sv[L];
        if (SV)
            _Pragma("unroll") for (int e = 0; e < L; e++) sv[e] = 0.0f;
        int s = 0;
        if (lead) {
            kcu_vec<T>::widen(c0, acc);
            kcu_vec<T>::widen(c1, acc + V);
            s = 1;
            const int64_t ni = i + 2 * stride;
            if (ni < n) {
                c0 = __ldg(lead + ni);
                c1 = __ldg(lead + (ni + stride < n ? ni + stride : ni));
            }
        } else {
            _Pragma("unroll") for (int e = 0; e < L; e++) acc[e] = 0.0f;
        }
        for (; s < a.n_ops; s++) {
            const kcu_fast_step st = a.ops[s];
            switch (st.kind) {
            case KCU_UOP_LOAD:
                if (SV && st.src == KCU_SRC_SV) {
                    _Pragma("unroll") for (int e = 0; e < L; e++) acc[e] = sv[e];
                } else if (st.src >= KCU_FAST_SCALAR) {
                    float v = kcu_scalar<T>(a, st.src - KCU_FAST_SCALAR);
                    _Pragma("unroll") for (int e = 0; e < L; e++) acc[e] = v;
                } else {
                    const uint4 *p = (const uint4 *)a.in[st.src - KCU_FAST_VEC];
                    kcu_vec<T>::widen(__ldg(p + i), acc);
                    kcu_vec<T>::widen(__ldg(p + j), acc + V);
                }
                break;
            case KCU_UOP_SAVE:
                if (SV)
                    _Pragma("unroll") for (int e = 0; e < L; e++) sv[e] = acc[e];
                break;
            case KCU_UOP_UNARY: kcu_unary_lanes<L, FAST>(st.op, acc); break;
            case KCU_UOP_BINARY_SCALAR:
                kcu_binary_lanes<L, FAST>(st.op, acc, kcu_scalar<T>(a, st.src - KCU_FAST_SCALAR));
                break;
            default:
                /* a vector operand, one 16-byte vector's lanes at a time
                 * (fewer registers live) */
                _Pragma("unroll") for (int h = 0; h < 2; h++)
                {
                    float y[V];
                    if (st.src == KCU_SRC_ACC) {
                        _Pragma("unroll") for (int e = 0; e < V; e++) y[e] = acc[h * V + e];
                    } else if (SV && st.src == KCU_SRC_SV) {
                        _Pragma("unroll") for (int e = 0; e < V; e++) y[e] = sv[h * V + e];
                    } else {
                        kcu_vec<T>::widen(__ldg((const uint4 *)a.in[st.src - KCU_FAST_VEC] + (h ? j : i)), y);
                    }
                    kcu_binary_lanes<V, FAST>(st.op, acc + h * V, (const float *)y);
                }
                break;
            }
        }
        ((uint4 *)a.out)[i] = kcu_vec<T>::narrow(acc);
        if (has2)
            ((uint4 *)a.out)[j] = kcu_vec<T>::narrow(acc + V);
    }
}

extern "C" int kcu_launch_ew(const kcu_ew_args *a, int32_t sms, void *stream)
{
    if (a->count <= a->start)
        return cudaSuccess;
    return (int)kcu_launch(kcu_ew_kernel, kcu_blocks(a->count - a->start, sms, 4), (cudaStream_t)stream, *a);
}

extern "C" int kcu_launch_ew_int(const kcu_ew_args *a, int32_t is_binary, int32_t op, int32_t sms,
                                 void *stream)
{
    if (a->count <= a->start)
        return cudaSuccess;
    return (int)kcu_launch(kcu_ew_int_kernel, kcu_blocks(a->count - a->start, sms, 4), (cudaStream_t)stream, *a,
                           (int)is_binary, (int)op);
}

extern "C" int kcu_launch_ew_fast(const kcu_fast_args *a, int32_t sms, void *stream)
{
    if (a->nvec <= 0)
        return cudaSuccess;
    /* one wave at the resident blocks per SM that __launch_bounds__ allows */
    unsigned per_sm = a->uses_sv ? 3u : 4u, cap = (unsigned)(sms > 0 ? sms : 132) * per_sm;
    unsigned blocks = kcu_blocks(a->nvec, sms, 2);
    if (blocks > cap)
        blocks = cap;
    cudaStream_t s = (cudaStream_t)stream;
#define KCU_FAST(T) \
    (a->uses_sv ? kcu_launch(kcu_fast_kernel<T, true>, blocks, s, *a) : kcu_launch(kcu_fast_kernel<T, false>, blocks, s, *a))
    switch (a->dtype) {
    case KILN_DTYPE_F32: return (int)KCU_FAST(float);
    case KILN_DTYPE_F16: return (int)KCU_FAST(__half);
    case KILN_DTYPE_BF16: return (int)KCU_FAST(__nv_bfloat16);
    default: return (int)cudaErrorInvalidValue;
    }
#undef KCU_FAST
}

/* ---- reduce and softmax -------------------------------------------------------------- */

__device__ __forceinline__ int64_t kcu_map_off(const kcu_map &m, int64_t i)
{
    int64_t off = 0;
    for (int d = m.rank - 1; d >= 0; d--) {
        off += (i % m.dims[d]) * m.st[d];
        i /= m.dims[d];
    }
    return off;
}

/* NaN wins a max/min, as in numpy and the CPU backend. */
__device__ __forceinline__ float kcu_pick(int is_max, float b, float v)
{
    return (is_max ? v > b : v < b) || v != v ? v : b;
}

/* One warp per output element; sums in f64 like the CPU reference, so the
 * result does not depend on the order. */
__global__ void kcu_reduce_kernel(const kcu_reduce_args a)
{
    kcu_after_prior();
    const int lane = threadIdx.x & 31;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    const int is_sum = a.op == KILN_REDUCE_SUM || a.op == KILN_REDUCE_MEAN;
    const int is_max = a.op == KILN_REDUCE_MAX;
    for (int64_t u = warp; u < a.n_out; u += warps) {
        int64_t base = kcu_map_off(a.kept, u);
        double sum = 0.0;
        float best = is_max ? -INFINITY : INFINITY;
        for (int64_t j = lane; j < a.rcount; j += 32) {
            float v = kcu_load(a.in, a.in_dtype, base + kcu_map_off(a.red, j));
            if (is_sum)
                sum += v;
            else
                best = kcu_pick(is_max, best, v);
        }
        for (int o = 16; o > 0; o >>= 1) {
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
            best = kcu_pick(is_max, best, __shfl_xor_sync(0xffffffffu, best, o));
        }
        if (lane == 0) {
            float v = a.op == KILN_REDUCE_SUM ? (float)sum
                      : a.op == KILN_REDUCE_MEAN ? (float)(sum / (double)a.rcount)
                                                 : best;
            kcu_store(a.out, a.out_dtype, u, v);
        }
    }
}

extern "C" int kcu_launch_reduce(const kcu_reduce_args *a, int32_t sms, void *stream)
{
    if (a->n_out <= 0)
        return cudaSuccess;
    return (int)kcu_launch(kcu_reduce_kernel, kcu_blocks(a->n_out * 32, sms, 1), (cudaStream_t)stream, *a);
}

/* One warp per line: max, sum of exp (f32), then exp(x - max) / sum. */
__global__ void kcu_softmax_kernel(const void *in, int in_dtype, void *out, int out_dtype, int64_t lines,
                                   int64_t len, int64_t inner)
{
    kcu_after_prior();
    const int lane = threadIdx.x & 31;
    int64_t warp = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t u = warp; u < lines; u += warps) {
        int64_t base = (u / inner) * len * inner + u % inner;
        float m = -INFINITY;
        for (int64_t j = lane; j < len; j += 32) {
            float v = kcu_load(in, in_dtype, base + j * inner);
            m = v > m ? v : m;
        }
        for (int o = 16; o > 0; o >>= 1) {
            float t = __shfl_xor_sync(0xffffffffu, m, o);
            m = t > m ? t : m;
        }
        float sum = 0.0f;
        for (int64_t j = lane; j < len; j += 32)
            sum += expf(kcu_load(in, in_dtype, base + j * inner) - m);
        for (int o = 16; o > 0; o >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, o);
        float inv = 1.0f / sum;
        for (int64_t j = lane; j < len; j += 32)
            kcu_store(out, out_dtype, base + j * inner, expf(kcu_load(in, in_dtype, base + j * inner) - m) * inv);
    }
}

extern "C" int kcu_launch_softmax(const void *in, int32_t in_dtype, void *out, int32_t out_dtype,
                                  int64_t lines, int64_t len, int64_t inner, int32_t sms, void *stream)
{
    if (lines <= 0 || len <= 0)
        return cudaSuccess;
    return (int)kcu_launch(kcu_softmax_kernel, kcu_blocks(lines * 32, sms, 1), (cudaStream_t)stream, in,
                           (int)in_dtype, out, (int)out_dtype, lines, len, inner);
}

/* ---- data movement ------------------------------------------------------------------- */

template <typename E>
__global__ void kcu_copy_kernel(const E *src, E *dst, int64_t count, int64_t base, const kcu_map dm,
                                const kcu_map sm)
{
    kcu_after_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        int64_t off = kcu_map_off(dm, i);
        if (sm.rank > 0)
            off = kcu_map_off(sm, off);
        dst[i] = src[base + off];
    }
}

template <typename E>
__global__ void kcu_band_kernel(const E *src, E *dst, int64_t rows, int64_t width, int64_t pitch, int64_t col)
{
    kcu_after_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x, n = rows * width;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[(i / width) * pitch + col + i % width] = src[i];
}

template <typename E, typename I>
__global__ void kcu_gather_kernel(const E *data, const I *idx, E *out, int64_t outer, int64_t n_idx,
                                  int64_t inner, int64_t dim, kcu_error_word *err, int layer)
{
    kcu_after_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x, n = outer * n_idx * inner;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < n; o += stride) {
        int64_t c = o % inner, j = (o / inner) % n_idx, i = o / (inner * n_idx);
        int64_t v = (int64_t)idx[j];
        if (v < 0 || v >= dim) {
            if (atomicCAS(&err->flag, 0, 1) == 0) {
                err->layer = layer;
                err->index = v;
                err->position = j;
            }
            v = v < 0 ? 0 : dim - 1;
        }
        out[o] = data[(i * dim + v) * inner + c];
    }
}

#define KCU_BY_ESIZE(esize, MACRO)                  \
    switch (esize) {                                \
    case 1: MACRO(uint8_t); break;                  \
    case 2: MACRO(uint16_t); break;                 \
    case 4: MACRO(uint32_t); break;                 \
    case 8: MACRO(uint64_t); break;                 \
    default: return (int)cudaErrorInvalidValue;     \
    }

extern "C" int kcu_launch_copy(const void *src, void *dst, int64_t count, int64_t base,
                               const kcu_map *dst_map, const kcu_map *src_map, int32_t esize, int32_t sms,
                               void *stream)
{
    if (count <= 0)
        return cudaSuccess;
    unsigned blocks = kcu_blocks(count, sms, 4);
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t err = cudaSuccess;
#define KCU_LAUNCH_COPY(E) \
    err = kcu_launch(kcu_copy_kernel<E>, blocks, s, (const E *)src, (E *)dst, count, base, *dst_map, *src_map)
    KCU_BY_ESIZE(esize, KCU_LAUNCH_COPY)
#undef KCU_LAUNCH_COPY
    return (int)err;
}

extern "C" int kcu_launch_band(const void *src, void *dst, int64_t rows, int64_t width, int64_t pitch,
                               int64_t col, int32_t esize, int32_t sms, void *stream)
{
    if (rows <= 0 || width <= 0)
        return cudaSuccess;
    unsigned blocks = kcu_blocks(rows * width, sms, 4);
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t err = cudaSuccess;
#define KCU_LAUNCH_BAND(E) err = kcu_launch(kcu_band_kernel<E>, blocks, s, (const E *)src, (E *)dst, rows, width, pitch, col)
    KCU_BY_ESIZE(esize, KCU_LAUNCH_BAND)
#undef KCU_LAUNCH_BAND
    return (int)err;
}

extern "C" int kcu_launch_gather(const void *data, const void *idx, int32_t idx_is_i64, void *out,
                                 int64_t outer, int64_t n_idx, int64_t inner, int64_t dim, int32_t esize,
                                 kcu_error_word *err, int32_t layer, int32_t sms, void *stream)
{
    if (outer <= 0 || n_idx <= 0 || inner <= 0)
        return cudaSuccess;
    unsigned blocks = kcu_blocks(outer * n_idx * inner, sms, 4);
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e = cudaSuccess;
#define KCU_LAUNCH_GATHER(E)                                                                           \
    e = idx_is_i64 ? kcu_launch(kcu_gather_kernel<E, int64_t>, blocks, s, (const E *)data, (const int64_t *)idx, \
                                (E *)out, outer, n_idx, inner, dim, err, (int)layer)                   \
                   : kcu_launch(kcu_gather_kernel<E, int32_t>, blocks, s, (const E *)data, (const int32_t *)idx, \
                                (E *)out, outer, n_idx, inner, dim, err, (int)layer)
    KCU_BY_ESIZE(esize, KCU_LAUNCH_GATHER)
#undef KCU_LAUNCH_GATHER
    return (int)e;
}

__device__ __forceinline__ int kcu_is_int(int t)
{
    return t == KILN_DTYPE_I8 || t == KILN_DTYPE_U8 || t == KILN_DTYPE_I32 || t == KILN_DTYPE_I64 ||
           t == KILN_DTYPE_BOOL;
}

/* Integers convert exactly between themselves (f32 would lose bits of large
 * i32/i64 values); everything else goes through f32, as kiln_convert. */
__global__ void kcu_cast_kernel(const void *src, int st, void *dst, int dt, int64_t n)
{
    kcu_after_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int ints = kcu_is_int(st) && kcu_is_int(dt);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (ints)
            kcu_store_clamp(dst, dt, i, kcu_load_int(src, st, i));
        else
            kcu_store(dst, dt, i, kcu_load(src, st, i));
    }
}

extern "C" int kcu_launch_cast(const void *src, int32_t src_dtype, void *dst, int32_t dst_dtype, int64_t n,
                               int32_t sms, void *stream)
{
    if (n <= 0)
        return cudaSuccess;
    return (int)kcu_launch(kcu_cast_kernel, kcu_blocks(n, sms, 4), (cudaStream_t)stream, src, (int)src_dtype, dst,
                           (int)dst_dtype, n);
}
