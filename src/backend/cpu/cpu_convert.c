/* Bulk dtype conversion for kernels: widening f16/bf16 operands to f32 and
 * narrowing f32 results back. These loops run over whole weight matrices,
 * so they avoid the per-element dtype switch of kiln_load_f32/kiln_store_f32. */
#include "backend/cpu/cpu_internal.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>

/* f16 weights are common; F16C widens them in one instruction where the
 * bit manipulation below takes a dozen. It quiets signalling NaNs (they
 * stay NaN). */
__attribute__((target("avx2,f16c"))) static void widen_f16_f16c(float *dst, const uint16_t *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = kiln_f16_to_f32(src[i]);
}

static int f16c_ok;
static pthread_once_t f16c_once = PTHREAD_ONCE_INIT;

static void f16c_probe(void)
{
    unsigned a, b, c, d;
    f16c_ok = __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}

int cpu_have_f16c(void)
{
    pthread_once(&f16c_once, f16c_probe);
    return f16c_ok;
}
#endif

CPU_SIMD static void cpu_widen_simd(float *dst, const uint16_t *src, kiln_dtype t, int64_t n)
{
    int64_t i = 0;
    if (t == KILN_DTYPE_BF16) {
        for (; i + 8 <= n; i += 8)
            cpu_bf16x8(dst + i, src + i);
        for (; i < n; i++)
            dst[i] = kiln_bf16_to_f32(src[i]);
    } else {
        for (; i + 8 <= n; i += 8)
            cpu_f16x8(dst + i, src + i);
        for (; i < n; i++)
            dst[i] = kiln_f16_to_f32(src[i]);
    }
}

void cpu_widen(float *dst, const uint16_t *src, kiln_dtype t, int64_t n)
{
#if defined(__x86_64__)
    if (t == KILN_DTYPE_F16 && cpu_have_f16c()) {
        widen_f16_f16c(dst, src, n);
        return;
    }
#endif
    cpu_widen_simd(dst, src, t, n);
}

CPU_SIMD static void cpu_narrow_bf16_simd(uint16_t *dst, const float *src, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        cpu_u8 x;
        memcpy(&x, src + i, sizeof x);
        cpu_u8 nan = (cpu_u8)((x & 0x7fffffffu) > 0x7f800000u);
        cpu_u8 r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
        cpu_u8 q = (x >> 16) | 0x40u;
        cpu_h8 h = __builtin_convertvector((q & nan) | (r & ~nan), cpu_h8);
        memcpy(dst + i, &h, sizeof h);
    }
    for (; i < n; i++)
        dst[i] = kiln_f32_to_bf16(src[i]);
}

void cpu_narrow_bf16(uint16_t *dst, const float *src, int64_t n) { cpu_narrow_bf16_simd(dst, src, n); }

/* Normal halves round by integer add (ties to even); values below the
 * smallest normal half round by a float add that lines the mantissa up
 * with half's subnormal grid, letting the FPU round to nearest even. */
CPU_SIMD static void cpu_narrow_f16_simd(uint16_t *dst, const float *src, int64_t n)
{
    const cpu_u8 zero = {0};
    const float denorm_magic = kiln_f32_from_bits(((127 - 15) + (23 - 10) + 1) << 23);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        cpu_u8 x;
        memcpy(&x, src + i, sizeof x);
        cpu_u8 a = x & 0x7fffffffu;
        cpu_u8 sign = (x >> 16) & 0x8000u;
        cpu_u8 normal = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
        cpu_u8 sub = (cpu_u8)((cpu_v8)a + denorm_magic) - kiln_f32_to_bits(denorm_magic);
        cpu_u8 nan = 0x7e00u | ((a >> 13) & 0x3ffu);
        cpu_u8 m_sub = (cpu_u8)(a < 0x38800000u), m_inf = (cpu_u8)(a >= 0x477ff000u);
        cpu_u8 m_nan = (cpu_u8)(a > 0x7f800000u);
        cpu_u8 r = (sub & m_sub) | (normal & ~m_sub);
        r = ((zero + 0x7c00u) & m_inf) | (r & ~m_inf);
        r = (nan & m_nan) | (r & ~m_nan);
        cpu_h8 h = __builtin_convertvector(r | sign, cpu_h8);
        memcpy(dst + i, &h, sizeof h);
    }
    for (; i < n; i++)
        dst[i] = kiln_float_to_half(src[i]);
}

void cpu_narrow_f16(uint16_t *dst, const float *src, int64_t n) { cpu_narrow_f16_simd(dst, src, n); }

static void convert_serial(void *dst, kiln_dtype dt, const void *src, kiln_dtype st, int64_t n)
{
    if (dt == KILN_DTYPE_F32 && (st == KILN_DTYPE_BF16 || st == KILN_DTYPE_F16)) {
        cpu_widen(dst, src, st, n);
    } else if (dt == KILN_DTYPE_BF16 && st == KILN_DTYPE_F32) {
        cpu_narrow_bf16(dst, src, n);
    } else if (dt == KILN_DTYPE_F16 && st == KILN_DTYPE_F32) {
        cpu_narrow_f16(dst, src, n);
    } else {
        kiln_convert(dst, dt, src, st, n);
    }
}

typedef struct convert_job {
    void *dst;
    const void *src;
    kiln_dtype dt, st;
} convert_job;

static void convert_range(void *p, int64_t begin, int64_t end)
{
    const convert_job *j = p;
    convert_serial((char *)j->dst + (size_t)begin * kiln_dtype_size(j->dt), j->dt,
                   (const char *)j->src + (size_t)begin * kiln_dtype_size(j->st), j->st, end - begin);
}

void cpu_convert(kiln_threadpool *pool, void *dst, kiln_dtype dst_type, const void *src, kiln_dtype src_type, int64_t n)
{
    if (n < KILN_CPU_PARALLEL_MIN) {
        convert_serial(dst, dst_type, src, src_type, n);
        return;
    }
    convert_job j = {dst, src, dst_type, src_type};
    kiln_threadpool_run(pool, n, convert_range, &j);
}
