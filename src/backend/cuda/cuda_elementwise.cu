/* Elementwise kernels: binary, unary and fused chains, as a generic
 * interpreter of the builder's step program (broadcasts, mixed dtypes,
 * integers, tails) and a vectorized one for the bandwidth-bound common case
 * (cuda_elementwise.c compiles the program for it). Arithmetic is f32 with
 * the formulas of src/core/scalar.h, rounding on store as the CPU does.
 *
 * Template instantiations are kept few (nvcc is slow on CI's two cores):
 * the vectorized kernel per float dtype, with and without the saved
 * register; everything else switches on dtype at run time. */
#include "backend/cuda/cuda_common.cuh"

#include <kiln/network.h>

int kcu_pdl = 1;

extern "C" void kcu_set_pdl(int32_t on) { kcu_pdl = on != 0; }

/* ---- elementwise: generic path ------------------------------------------------------ */

/* The register file lives in local memory here (dynamic indices); this
 * path serves broadcasts, odd dtypes and tails, the vectorized one below
 * serves bandwidth. */
__global__ void kcu_ew_kernel(const kcu_ew_args a)
{
    KTL_SCOPE(0);
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
            r[a.n_in + s] = st.is_binary ? kiln_binary_f32(st.op, r[st.a], r[st.b]) : kiln_unary_f32(st.op, r[st.a]);
        }
        kcu_store(a.out, a.out_dtype, i, r[a.n_in + a.n_steps - 1]);
    }
}

__global__ void kcu_ew_int_kernel(const kcu_ew_args a, int is_binary, int op)
{
    KTL_SCOPE(0);
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
        int64_t x = kiln_elem_load_int(a.in[0], a.in_dtype[0], off[0]);
        int64_t v = is_binary ? kiln_binary_int(op, x, kiln_elem_load_int(a.in[1], a.in_dtype[1], off[1]))
                              : kiln_unary_int(op, x);
        kiln_elem_store_wrap(a.out, a.out_dtype, i, v);
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
 * kiln_f32_to_f16/kiln_f32_to_bf16, and differs only in a NaN's payload (the
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
template <> struct kcu_vec<__half> : kcu_vec16<kiln_f16_to_f32, kcu_pack_f16> {
};
template <> struct kcu_vec<__nv_bfloat16> : kcu_vec16<kiln_bf16_to_f32, kcu_pack_bf16> {
};

/* Rare or long ops as calls: inlined on every lane they would take the
 * registers the memory-bound common case needs. */
__device__ __noinline__ float kcu_unary_call(int op, float x) { return kiln_unary_f32(op, x); }
__device__ __noinline__ float kcu_pow_call(float x, float y) { return kiln_binary_f32(KILN_BINARY_POW, x, y); }

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

#define KCU_LANES_DO(expr) \
    _Pragma("unroll") for (int e = 0; e < L; e++) \
    { \
        float v = acc[e]; \
        acc[e] = (expr); \
    } \
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
#define KCU_BIN(OP, expr) \
    case OP: \
        _Pragma("unroll") for (int e = 0; e < L; e++) \
        { \
            float p = acc[e], q = KCU_Y(e); \
            acc[e] = (expr); \
        } \
        break; \
    case OP | KCU_SWAPPED: \
        _Pragma("unroll") for (int e = 0; e < L; e++) \
        { \
            float p = KCU_Y(e), q = acc[e]; \
            acc[e] = (expr); \
        } \
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
    KTL_SCOPE(0);
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

extern "C" int kcu_launch_ew_int(const kcu_ew_args *a, int32_t is_binary, int32_t op, int32_t sms, void *stream)
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
    (a->uses_sv ? kcu_launch(kcu_fast_kernel<T, true>, blocks, s, *a) \
                : kcu_launch(kcu_fast_kernel<T, false>, blocks, s, *a))
    switch (a->dtype) {
    case KILN_DTYPE_F32: return (int)KCU_FAST(float);
    case KILN_DTYPE_F16: return (int)KCU_FAST(__half);
    case KILN_DTYPE_BF16: return (int)KCU_FAST(__nv_bfloat16);
    default: return (int)cudaErrorInvalidValue;
    }
#undef KCU_FAST
}
