/* The CUDA backend's kernels. Storage is f32, f16 or bf16 (integers where
 * the CPU backend takes them); arithmetic is f32 and follows the CPU
 * reference kernels op by op (same formulas, same NaN rules, same rounding
 * on store). Every kernel is a grid-stride loop over 64-bit indices, so any
 * tensor size works with a bounded grid.
 *
 * Template instantiations are kept few (nvcc is slow on CI's two cores):
 * the vectorized fused kernel per float dtype and the copies per element
 * size; everything else switches on dtype at run time. */
#include "cuda_internal.h"

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

/* ---- element conversions (bit-exact with src/core/dtype.c) ------------------------- */

__device__ __forceinline__ float kcu_bf16_f32(uint16_t b) { return __uint_as_float((uint32_t)b << 16); }

__device__ __forceinline__ uint16_t kcu_f32_bf16(float f)
{
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

__device__ __forceinline__ float kcu_f16_f32(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/* Round to nearest even; NaN keeps its top payload bits, as the host does. */
__device__ __forceinline__ uint16_t kcu_f32_f16(float f)
{
    uint32_t x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(((x >> 16) & 0x8000u) | 0x7e00u | ((x >> 13) & 0x3ffu));
    return __half_as_ushort(__float2half_rn(f));
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
 * Memory moves 16 bytes per load and store; the program runs on 4 lanes at
 * a time (one 16-byte vector of f32, half of one of f16/bf16), which keeps
 * the register file small enough for 4 blocks per SM without spilling. */

#define KCU_LANES 4

template <typename T> struct kcu_vec;
template <> struct kcu_vec<float> {
    enum { parts = 1 };
    static __device__ __forceinline__ float one(const void *p) { return __ldg((const float *)p); }
    static __device__ __forceinline__ void widen(const uint4 &u, int, float *v)
    {
        v[0] = __uint_as_float(u.x);
        v[1] = __uint_as_float(u.y);
        v[2] = __uint_as_float(u.z);
        v[3] = __uint_as_float(u.w);
    }
    static __device__ __forceinline__ void narrow(const float *v, int, uint4 &o)
    {
        o = make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
    }
};

/* Half `h` of 8 16-bit values in a uint4: words 2h and 2h+1, element 2j in
 * the low half of a word. */
template <float (*W)(uint16_t), uint16_t (*N)(float)> struct kcu_vec16 {
    enum { parts = 2 };
    static __device__ __forceinline__ float one(const void *p) { return W(__ldg((const unsigned short *)p)); }
    static __device__ __forceinline__ void widen(const uint4 &u, int h, float *v)
    {
        uint32_t w0 = h ? u.z : u.x, w1 = h ? u.w : u.y;
        v[0] = W((uint16_t)(w0 & 0xffffu));
        v[1] = W((uint16_t)(w0 >> 16));
        v[2] = W((uint16_t)(w1 & 0xffffu));
        v[3] = W((uint16_t)(w1 >> 16));
    }
    static __device__ __forceinline__ void narrow(const float *v, int h, uint4 &o)
    {
        uint32_t w0 = (uint32_t)N(v[0]) | ((uint32_t)N(v[1]) << 16);
        uint32_t w1 = (uint32_t)N(v[2]) | ((uint32_t)N(v[3]) << 16);
        if (h) {
            o.z = w0;
            o.w = w1;
        } else {
            o.x = w0;
            o.y = w1;
        }
    }
};
template <> struct kcu_vec<__half> : kcu_vec16<kcu_f16_f32, kcu_f32_f16> {};
template <> struct kcu_vec<__nv_bfloat16> : kcu_vec16<kcu_bf16_f32, kcu_f32_bf16> {};

#define KCU_COPY(dst, src) _Pragma("unroll") for (int e = 0; e < KCU_LANES; e++) (dst)[e] = (src)[e]

/* One operand for 4 lanes: a register, part h of an input's 16-byte vector,
 * or a broadcast one-element input. The branches are uniform across the
 * grid, so they cost per vector, not per element. */
template <typename T>
__device__ __forceinline__ void kcu_fetch(float *x, int code, const kcu_fast_args &a, int64_t i, int h,
                                          const float *r0, const float *r1)
{
    if (code == 0) {
        KCU_COPY(x, r0);
        return;
    }
    if (code == 1) {
        KCU_COPY(x, r1);
        return;
    }
    if (code >= KCU_FAST_SCALAR) {
        float s = kcu_vec<T>::one(a.in[code - KCU_FAST_SCALAR]);
        _Pragma("unroll") for (int e = 0; e < KCU_LANES; e++) x[e] = s;
        return;
    }
    const uint4 u = __ldg((const uint4 *)a.in[code - KCU_FAST_VEC] + i);
    kcu_vec<T>::widen(u, h, x);
}

/* Transcendental ops as calls: inlined four times over they would take
 * the registers the memory-bound common case needs. */
__device__ __noinline__ float kcu_unary_call(int op, float x) { return kcu_unary(op, x); }
__device__ __noinline__ float kcu_pow_call(float x, float y) { return powf(x, y); }

#define KCU_UNARY_CASE(OP, expr)                                 \
    case OP:                                                     \
        _Pragma("unroll") for (int e = 0; e < KCU_LANES; e++)    \
        {                                                        \
            float v = x[e];                                      \
            x[e] = expr;                                         \
        }                                                        \
        break;
#define KCU_BINARY_CASE(OP, expr)                                \
    case OP:                                                     \
        _Pragma("unroll") for (int e = 0; e < KCU_LANES; e++)    \
        {                                                        \
            float p = x[e], q = y[e];                            \
            x[e] = expr;                                         \
        }                                                        \
        break;

/* At least 4 blocks of 256 threads per SM: the kernel lives on memory
 * parallelism, and the next iteration's input vectors are prefetched into
 * L2 so more DRAM requests are in flight than registers alone allow. */
template <typename T> __global__ void __launch_bounds__(KCU_THREADS, 4) kcu_fast_kernel(const kcu_fast_args a)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.nvec; i += stride) {
        if (i + stride < a.nvec)
            for (int k = 0; k < a.n_vec_in; k++)
                asm volatile("prefetch.global.L2 [%0];" ::"l"((const uint4 *)a.in[a.vec_in[k]] + i + stride));
        uint4 o = make_uint4(0, 0, 0, 0);
#pragma unroll 1
        for (int h = 0; h < kcu_vec<T>::parts; h++) {
            float r0[KCU_LANES], r1[KCU_LANES], x[KCU_LANES], y[KCU_LANES];
            _Pragma("unroll") for (int e = 0; e < KCU_LANES; e++) r0[e] = r1[e] = y[e] = 0.0f;
            for (int s = 0; s < a.n_steps; s++) {
                const kcu_fast_step st = a.steps[s];
                kcu_fetch<T>(x, st.a, a, i, h, r0, r1);
                if (st.is_binary) {
                    kcu_fetch<T>(y, st.b, a, i, h, r0, r1);
                    switch (st.op) {
                        KCU_BINARY_CASE(KILN_BINARY_ADD, p + q)
                        KCU_BINARY_CASE(KILN_BINARY_SUB, p - q)
                        KCU_BINARY_CASE(KILN_BINARY_MUL, p * q)
                        KCU_BINARY_CASE(KILN_BINARY_DIV, p / q)
                        KCU_BINARY_CASE(KILN_BINARY_POW, kcu_pow_call(p, q))
                        KCU_BINARY_CASE(KILN_BINARY_MAX, p > q ? p : q)
                        KCU_BINARY_CASE(KILN_BINARY_MIN, p < q ? p : q)
                    default: break;
                    }
                } else {
                    switch (st.op) {
                        KCU_UNARY_CASE(KILN_UNARY_NEG, -v)
                        KCU_UNARY_CASE(KILN_UNARY_ABS, fabsf(v))
                        KCU_UNARY_CASE(KILN_UNARY_RELU, v > 0.0f ? v : 0.0f)
                    default:
                        _Pragma("unroll") for (int e = 0; e < KCU_LANES; e++) x[e] = kcu_unary_call(st.op, x[e]);
                        break;
                    }
                }
                if (st.dst == 0) {
                    KCU_COPY(r0, x);
                } else {
                    KCU_COPY(r1, x);
                }
            }
            kcu_vec<T>::narrow(a.result == 0 ? r0 : r1, h, o);
        }
        ((uint4 *)a.out)[i] = o;
    }
}

extern "C" int kcu_launch_ew(const kcu_ew_args *a, int32_t sms, void *stream)
{
    if (a->count <= a->start)
        return cudaSuccess;
    kcu_ew_kernel<<<kcu_blocks(a->count - a->start, sms, 4), KCU_THREADS, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}

extern "C" int kcu_launch_ew_int(const kcu_ew_args *a, int32_t is_binary, int32_t op, int32_t sms,
                                 void *stream)
{
    if (a->count <= a->start)
        return cudaSuccess;
    kcu_ew_int_kernel<<<kcu_blocks(a->count - a->start, sms, 4), KCU_THREADS, 0, (cudaStream_t)stream>>>(
        *a, is_binary, op);
    return (int)cudaGetLastError();
}

extern "C" int kcu_launch_ew_fast(const kcu_fast_args *a, int32_t sms, void *stream)
{
    if (a->nvec <= 0)
        return cudaSuccess;
    /* one wave at the 4 resident blocks per SM that __launch_bounds__ allows */
    unsigned blocks = kcu_blocks(a->nvec, sms, 1);
    if (blocks > (unsigned)(sms > 0 ? sms : 132) * 4u)
        blocks = (unsigned)(sms > 0 ? sms : 132) * 4u;
    cudaStream_t s = (cudaStream_t)stream;
    switch (a->dtype) {
    case KILN_DTYPE_F32: kcu_fast_kernel<float><<<blocks, KCU_THREADS, 0, s>>>(*a); break;
    case KILN_DTYPE_F16: kcu_fast_kernel<__half><<<blocks, KCU_THREADS, 0, s>>>(*a); break;
    case KILN_DTYPE_BF16: kcu_fast_kernel<__nv_bfloat16><<<blocks, KCU_THREADS, 0, s>>>(*a); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
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
    kcu_reduce_kernel<<<kcu_blocks(a->n_out * 32, sms, 1), KCU_THREADS, 0, (cudaStream_t)stream>>>(*a);
    return (int)cudaGetLastError();
}

/* One warp per line: max, sum of exp (f32), then exp(x - max) / sum. */
__global__ void kcu_softmax_kernel(const void *in, int in_dtype, void *out, int out_dtype, int64_t lines,
                                   int64_t len, int64_t inner)
{
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
    kcu_softmax_kernel<<<kcu_blocks(lines * 32, sms, 1), KCU_THREADS, 0, (cudaStream_t)stream>>>(
        in, in_dtype, out, out_dtype, lines, len, inner);
    return (int)cudaGetLastError();
}

/* ---- data movement ------------------------------------------------------------------- */

template <typename E>
__global__ void kcu_copy_kernel(const E *src, E *dst, int64_t count, int64_t base, const kcu_map dm,
                                const kcu_map sm)
{
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
    int64_t stride = (int64_t)gridDim.x * blockDim.x, n = rows * width;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[(i / width) * pitch + col + i % width] = src[i];
}

template <typename E, typename I>
__global__ void kcu_gather_kernel(const E *data, const I *idx, E *out, int64_t outer, int64_t n_idx,
                                  int64_t inner, int64_t dim, kcu_error_word *err, int layer)
{
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
#define KCU_LAUNCH_COPY(E) \
    kcu_copy_kernel<E><<<blocks, KCU_THREADS, 0, s>>>((const E *)src, (E *)dst, count, base, *dst_map, *src_map)
    KCU_BY_ESIZE(esize, KCU_LAUNCH_COPY)
#undef KCU_LAUNCH_COPY
    return (int)cudaGetLastError();
}

extern "C" int kcu_launch_band(const void *src, void *dst, int64_t rows, int64_t width, int64_t pitch,
                               int64_t col, int32_t esize, int32_t sms, void *stream)
{
    if (rows <= 0 || width <= 0)
        return cudaSuccess;
    unsigned blocks = kcu_blocks(rows * width, sms, 4);
    cudaStream_t s = (cudaStream_t)stream;
#define KCU_LAUNCH_BAND(E) \
    kcu_band_kernel<E><<<blocks, KCU_THREADS, 0, s>>>((const E *)src, (E *)dst, rows, width, pitch, col)
    KCU_BY_ESIZE(esize, KCU_LAUNCH_BAND)
#undef KCU_LAUNCH_BAND
    return (int)cudaGetLastError();
}

extern "C" int kcu_launch_gather(const void *data, const void *idx, int32_t idx_is_i64, void *out,
                                 int64_t outer, int64_t n_idx, int64_t inner, int64_t dim, int32_t esize,
                                 kcu_error_word *err, int32_t layer, int32_t sms, void *stream)
{
    if (outer <= 0 || n_idx <= 0 || inner <= 0)
        return cudaSuccess;
    unsigned blocks = kcu_blocks(outer * n_idx * inner, sms, 4);
    cudaStream_t s = (cudaStream_t)stream;
#define KCU_LAUNCH_GATHER(E)                                                                         \
    if (idx_is_i64)                                                                                  \
        kcu_gather_kernel<E, int64_t><<<blocks, KCU_THREADS, 0, s>>>(                                 \
            (const E *)data, (const int64_t *)idx, (E *)out, outer, n_idx, inner, dim, err, layer);  \
    else                                                                                             \
        kcu_gather_kernel<E, int32_t><<<blocks, KCU_THREADS, 0, s>>>(                                 \
            (const E *)data, (const int32_t *)idx, (E *)out, outer, n_idx, inner, dim, err, layer)
    KCU_BY_ESIZE(esize, KCU_LAUNCH_GATHER)
#undef KCU_LAUNCH_GATHER
    return (int)cudaGetLastError();
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
    kcu_cast_kernel<<<kcu_blocks(n, sms, 4), KCU_THREADS, 0, (cudaStream_t)stream>>>(src, src_dtype, dst,
                                                                                      dst_dtype, n);
    return (int)cudaGetLastError();
}
