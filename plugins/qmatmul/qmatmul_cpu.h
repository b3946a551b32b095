/* The CPU side of kiln/QuantMatMul: the weight formats, the 8-bit
 * activations and the dot-product kernels (portable C, AVX2, AVX-512 VNNI),
 * chosen at run time. qmatmul.c drives them over rows and threads. */
#ifndef KILN_PLUGINS_QMATMUL_CPU_H
#define KILN_PLUGINS_QMATMUL_CPU_H

#include <stddef.h>
#include <stdint.h>

/* ggml type numbers (GGUF's). */
enum {
    QMM_F16 = 1,
    QMM_Q4_0 = 2,
    QMM_Q4_1 = 3,
    QMM_Q5_0 = 6,
    QMM_Q5_1 = 7,
    QMM_Q8_0 = 8,
    QMM_Q4_K = 12,
    QMM_Q5_K = 13,
    QMM_Q6_K = 14,
    QMM_BF16 = 30
};

/* A weight format: `block` elements in `bytes` bytes (F16/BF16 counted by
 * 32 elements, so every row is whole blocks); `act_block` is the block of
 * its 8-bit activations, 32 or 256 (the K formats), 0 for F16/BF16,
 * which multiply f32 activations. */
typedef struct qmm_format {
    int32_t type;
    const char *name;
    int32_t block, bytes, act_block;
} qmm_format;

const qmm_format *kiln_qmm_format(int32_t type);           /* NULL: not a format QuantMatMul reads */
const qmm_format *kiln_qmm_format_named(const char *name); /* NULL likewise */

/* 32 activations quantized as ggml's Q8_0/Q8_1: x ≈ d · q, d = max|x| / 127,
 * ds = d · Σq (for the min term of Q4_1 and Q5_1). */
typedef struct qmm_q8 {
    float d, ds;
    int8_t q[32];
} qmm_q8;

/* 256 activations for the K formats (as ggml's Q8_K): one d, the sums of
 * q by 16 (for their mins and Q6_K's offset). */
typedef struct qmm_q8k {
    float d;
    int16_t bsums[16];
    int8_t q[256];
} qmm_q8k;

/* Bytes of one row of k quantized activations for format f (0: f32). */
size_t kiln_qmm_act_row_bytes(const qmm_format *f, int32_t k);
/* Quantizes one row of k values (k a multiple of f->act_block). */
void kiln_qmm_quantize_row(const qmm_format *f, const float *x, int32_t k, void *out);

/* One weight row w (k values) against R rows of x (R = 1 or 4), xs bytes
 * apart, each either quantized (kiln_qmm_quantize_row) or f32: out[r]. */
typedef void (*qmm_kernel)(int32_t type, const uint8_t *w, const void *x, size_t xs, int32_t k, float *out);

typedef struct qmm_kernels {
    qmm_kernel one, four;
    int f32_act; /* x is f32 (F16/BF16, or f32 activations asked for) */
} qmm_kernels;

/* The kernels for f: isa "c" the portable reference, "avx2" AVX2 without
 * VNNI, anything else the best the CPU has; f32_act nonzero: dequantize to
 * f32 and multiply f32 activations (the exact path). */
void kiln_qmm_kernels_pick(const qmm_format *f, const char *isa, int f32_act, qmm_kernels *out);

#endif
