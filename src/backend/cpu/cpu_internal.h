/* Shared pieces of the CPU kernels: 8-lane SIMD helpers, bulk dtype
 * conversions, the f32 elementwise primitives, and the per-op entry points
 * that cpu_backend.c dispatches to. Element counts and layer checks come
 * from src/backend/layer_check.h, scalar conversions and formulas from
 * src/core/scalar.h (both shared with the CUDA backend). */
#ifndef KILN_BACKEND_CPU_INTERNAL_H
#define KILN_BACKEND_CPU_INTERNAL_H

#include "backend/cpu/cpu_backend.h"
#include "backend/layer_check.h"

#include "core/dtype.h"
#include "core/error.h"
#include "core/scalar.h"

#include <math.h>
#include <string.h>

/* Elements processed per inner step of an elementwise kernel: large enough
 * to vectorize, small enough that the f32 staging buffers stay in L1. */
#define KILN_CPU_BLOCK 256

/* Below this many elements (or multiply-adds) a kernel runs on the calling
 * thread: waking workers costs more than the work. */
#define KILN_CPU_PARALLEL_MIN 32768

/* The pool a kernel should use: none in reference mode. */
static inline kiln_threadpool *cpu_pool(const kiln_cpu_args *a) { return a->reference ? NULL : a->pool; }

static inline const char *cpu_layer_name(const kiln_cpu_args *a)
{
    return a->layer && a->layer->name ? a->layer->name : "?";
}

/* ---- SIMD ----------------------------------------------------------------------------
 * Hot loops are written with GCC/Clang vector extensions (8 floats), and
 * the functions holding them are cloned for AVX2 with a run-time pick, so
 * the default x86-64 build still uses 256-bit units where they exist.
 * No helper passes or returns a vector by value: that changes with AVX and
 * both compilers object (clang with a hard error in the default clone), so
 * helpers are macros or write through pointers. Loads and stores go
 * through memcpy: the data has no alignment promise. */
typedef float cpu_v8 __attribute__((vector_size(32)));
typedef uint32_t cpu_u8 __attribute__((vector_size(32)));
typedef int32_t cpu_i8 __attribute__((vector_size(32)));
typedef uint16_t cpu_h8 __attribute__((vector_size(16)));

/* Only on static functions: clang 14 cannot call a cloned function from
 * another translation unit, so the exported kernels are thin wrappers. */
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CPU_NO_CLONES 1 /* TSan crashes in ifunc resolvers, which run before it starts */
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define CPU_NO_CLONES 1
#endif

#if defined(__x86_64__) && !defined(CPU_NO_CLONES)
#define CPU_SIMD __attribute__((target_clones("avx2", "default")))
#else
#define CPU_SIMD
#endif

#define cpu_ld8(v, p) memcpy(&(v), (p), sizeof(cpu_v8))
#define cpu_st8(p, v) memcpy((p), &(v), sizeof(cpu_v8))

/* Lanes of a where mask is set, else of b. */
#define cpu_select8(mask, a, b) ((cpu_v8)(((mask) & (cpu_u8)(a)) | (~(mask) & (cpu_u8)(b))))

/* *out = e^x for 8 lanes (Cephes expf: range reduction by ln 2 in two
 * parts, then a degree-6 polynomial; within 2 ulp of the true value).
 * Below ln(FLT_MIN) it gives 0 (no subnormals), so exp(-inf) is exactly 0
 * as softmax masks need; above ln(FLT_MAX) +inf; NaN stays NaN. */
static inline void cpu_exp8(cpu_v8 *out, const cpu_v8 *px)
{
    const cpu_v8 zero = {0}, x = *px;
    const cpu_v8 lo = zero - 87.3365447504f, hi = zero + 88.7228391117f;
    cpu_u8 under = (cpu_u8)(x < lo), over = (cpu_u8)(x > hi), nan = (cpu_u8)(x != x);
    cpu_v8 v = cpu_select8(under, lo, cpu_select8(over, hi, x));
    cpu_v8 fx = v * 1.44269504088896341f + 0.5f;
    cpu_v8 t = __builtin_convertvector(__builtin_convertvector(fx, cpu_i8), cpu_v8);
    t -= cpu_select8((cpu_u8)(t > fx), zero + 1.0f, zero); /* floor */
    v -= t * 0.693359375f;
    v -= t * -2.12194440e-4f;
    cpu_v8 y = 1.9875691500e-4f * v + 1.3981999507e-3f;
    y = y * v + 8.3334519073e-3f;
    y = y * v + 4.1665795894e-2f;
    y = y * v + 1.6666665459e-1f;
    y = y * v + 5.0000001201e-1f;
    y = y * (v * v) + v + 1.0f;
    /* 2^n in two factors so n = 128 or -126 never builds a bad exponent */
    cpu_i8 n = __builtin_convertvector(t, cpu_i8), n1 = n >> 1, n2 = n - n1;
    y = y * (cpu_v8)((n1 + 127) << 23) * (cpu_v8)((n2 + 127) << 23);
    y = cpu_select8(under, zero, cpu_select8(over, zero + INFINITY, y));
    *out = cpu_select8(nan, x, y);
}

/* Eight f16 or bf16 values widened to f32 (bit-exact with the scalar ones). */
static inline void cpu_bf16x8(float *dst, const uint16_t *p)
{
    cpu_h8 h;
    memcpy(&h, p, sizeof h);
    cpu_u8 u = __builtin_convertvector(h, cpu_u8) << 16;
    memcpy(dst, &u, sizeof u);
}

static inline void cpu_f16x8(float *dst, const uint16_t *p)
{
    cpu_h8 h;
    memcpy(&h, p, sizeof h);
    cpu_u8 x = __builtin_convertvector(h, cpu_u8);
    const cpu_u8 exp_mask = (cpu_u8){0} + (0x7c00u << 13);
    cpu_u8 o = (x & 0x7fffu) << 13;
    cpu_u8 e = o & exp_mask;
    o += (uint32_t)(127 - 15) << 23;
    o += (cpu_u8)(e == exp_mask) & ((uint32_t)(128 - 16) << 23);
    cpu_u8 sub = (cpu_u8)((cpu_v8)(o + (1u << 23)) - kiln_f32_from_bits(113u << 23));
    cpu_u8 is_sub = (cpu_u8)(e == 0);
    o = (sub & is_sub) | (o & ~is_sub);
    o |= (x & 0x8000u) << 16;
    memcpy(dst, &o, sizeof o);
}

/* n f16 (t == KILN_DTYPE_F16) or bf16 values to f32, and f32 to bf16
 * (cpu_convert.c). Bit-exact with the dtype.h conversions, except that
 * signalling f16 NaNs may come out quiet. */
void cpu_widen(float *dst, const uint16_t *src, kiln_dtype t, int64_t n);
void cpu_narrow_bf16(uint16_t *dst, const float *src, int64_t n);
/* f32 to f16, bit-exact with kiln_float_to_half (NaN payloads included). */
void cpu_narrow_f16(uint16_t *dst, const float *src, int64_t n);

#if defined(__x86_64__)
/* Nonzero when the CPU (and OS) can run AVX2 + F16C code (cpu_convert.c). */
int cpu_have_f16c(void);
#endif

/* n elements between any two dtypes (cpu_convert.c): fast loops between
 * f32 and f16/bf16, kiln_convert otherwise. Splits across `pool` when n is
 * large. */
void cpu_convert(kiln_threadpool *pool, void *dst, kiln_dtype dst_type, const void *src, kiln_dtype src_type,
                 int64_t n);

/* f32 elementwise primitives over n contiguous elements (cpu_elementwise.c). */
void cpu_binary_f32(kiln_binary_op op, const float *a, const float *b, float *out, int64_t n);
void cpu_unary_f32(kiln_unary_op op, const float *x, float *out, int64_t n);

/* Op entry points; each validates what it needs and names the layer. */
kiln_status cpu_run_matmul(const kiln_cpu_args *a);
kiln_status cpu_run_binary(const kiln_cpu_args *a);
kiln_status cpu_run_unary(const kiln_cpu_args *a);
kiln_status cpu_run_fused(const kiln_cpu_args *a);
kiln_status cpu_run_reduce(const kiln_cpu_args *a);
kiln_status cpu_run_softmax(const kiln_cpu_args *a);
kiln_status cpu_run_concat(const kiln_cpu_args *a);
kiln_status cpu_run_slice(const kiln_cpu_args *a);
kiln_status cpu_run_shuffle(const kiln_cpu_args *a);
kiln_status cpu_run_gather(const kiln_cpu_args *a);
kiln_status cpu_run_cast(const kiln_cpu_args *a);

#endif
