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

/* Quantizes n values (n a multiple of 16): q = round(x / d) with halves
 * away from zero, d = max|x| / 127 returned; every implementation gives
 * the same bytes. */
typedef float (*qmm_quant_fn)(const float *x, int32_t n, int8_t *q);

/* Quantizes one row of k values (k a multiple of f->act_block). */
void kiln_qmm_quantize_row(const qmm_format *f, qmm_quant_fn quant, const float *x, int32_t k, void *out);

/* One weight row w (k values) against R rows of x (R = 1 or 4), xs bytes
 * apart, each either quantized (kiln_qmm_quantize_row) or f32: out[r]. */
typedef void (*qmm_kernel)(int32_t type, const uint8_t *w, const void *x, size_t xs, int32_t k, float *out);

typedef struct qmm_kernels {
    qmm_kernel one, four;
    qmm_quant_fn quant;
    int f32_act; /* x is f32 (F16/BF16, or f32 activations asked for) */
} qmm_kernels;

/* The kernels for f: isa "c" the portable reference, "avx2" AVX2 without
 * VNNI, "avx512" AVX-512 VNNI without the kernels that also need VBMI or
 * GFNI (what a CPU with VNNI alone runs), anything else the best the CPU
 * has; f32_act nonzero: dequantize to f32 and multiply f32 activations
 * (the exact path). */
void kiln_qmm_kernels_pick(const qmm_format *f, const char *isa, int f32_act, qmm_kernels *out);

/* ---- the tiled GEMM (many rows of x; AVX-512 VNNI) ----
 * Each weight row is cut into sub-blocks of kiln_qmm_gemm_sub(f) values
 * (16 for Q6_K, else 32) whose weights are w = sc · u + mn with u an
 * unsigned byte (the stored quant, offset so that it is unsigned) and sc,
 * mn floats. A tile of QMM_GEMM_LANES weight rows is unpacked into that
 * form once, interleaved so that one 512-bit register holds four
 * consecutive u of every row, and then meets every row of x: each vpdpbusd
 * multiplies four u of sixteen weight rows by four broadcast q of one row
 * of x. The integer sums are those of the dot kernels above (exact), and
 * each sub-block is scaled once in f32:
 *   Σ w·x ≈ Σ_j xd_j · sc_j · Σ u·q + mn_j · (xd_j · Σ q).
 * The rows of x in the GEMM layout come in panels of QMM_GEMM_PANEL rows
 * (the last one padded with zero rows): the int8 q of the panel's rows
 * (quantized as kiln_qmm_quantize_row does) four by four, [k / 4][panel
 * row][4], then per sub-block each row's f32 xd, then per sub-block each
 * row's f32 xd · Σ q. */
#define QMM_GEMM_LANES 16
#define QMM_GEMM_PANEL 8

int32_t kiln_qmm_gemm_sub(const qmm_format *f);
size_t kiln_qmm_gemm_panel_bytes(const qmm_format *f, int32_t k);
/* Quantizes one row of k values of x into row `slot` of a panel; x NULL:
 * a zero row (padding). */
void kiln_qmm_gemm_quantize_row(const qmm_format *f, qmm_quant_fn quant, const float *x, int32_t k, void *panel,
                                int32_t slot);

/* y[r · ldy + c] = Σ w_c · x_r for the n_w (<= QMM_GEMM_LANES) weight rows
 * at w (wrow bytes apart; panel: the one panel of the row-panel layout
 * below at w) and `rows` rows of x in panels at x. */
typedef void (*qmm_gemm_fn)(int32_t type, const uint8_t *w, size_t wrow, int32_t n_w, int panel, int32_t k,
                            const void *x, int64_t rows, float *y, int64_t ldy);

/* The tiled GEMM for f with this isa (KILN_QMATMUL_ISA), or NULL where it
 * does not run: formats without 8-bit activations, isa "c" or "avx2", or a
 * CPU without AVX-512 VNNI (the four-row kernels serve those). */
qmm_gemm_fn kiln_qmm_gemm_pick(const qmm_format *f, const char *isa);

/* ---- the decode GEMV for Q4_0 and Q4_1 (AVX-512 VBMI + VNNI) ----
 * One row of x against many weight rows, four blocks of a weight row a
 * step: their bytes are two loads and two byte permutes (vpermt2b) gather
 * the 64 quant bytes (block j in 128-bit lane j) and the f16 scales (and
 * mins) spread over the lanes of their block, against x repacked once per
 * call to match. About 4 instructions a block where the one-row kernel
 * above takes over 20: that kernel is bound by its instructions at ~7 GB/s
 * of weights per core, below what two cores can read. The integer sums
 * are those of the other kernels (exact). */
typedef struct qmm_gemv4_x {
    int8_t lo[64], hi[64]; /* q[0..15] and q[16..31] of block j in lane j */
    float d[16];           /* block j's d in lanes 4j..4j+3 */
    float s[16];           /* block j's ds in lane 4j, 0 elsewhere */
} qmm_gemv4_x;

/* Bytes of x packed for k values (groups of four blocks, the last padded). */
static inline size_t kiln_qmm_gemv4_x_bytes(int32_t k) { return (size_t)((k / 32 + 3) / 4) * sizeof(qmm_gemv4_x); }
/* One row of k quantized activations (kiln_qmm_quantize_row) repacked. */
void kiln_qmm_gemv4_pack_x(const void *xq, int32_t k, void *out);
/* y[r] = w_r · x for n_rows weight rows wrow bytes apart. */
typedef void (*qmm_gemv4_fn)(const uint8_t *w, size_t wrow, int64_t n_rows, int32_t k, const void *xg, float *y);
/* The GEMV for f, or NULL: formats other than Q4_0/Q4_1, isa "c", "avx2"
 * or "avx512", f32 activations, or a CPU without AVX-512 VBMI and VNNI. */
qmm_gemv4_fn kiln_qmm_gemv4_pick(const qmm_format *f, const char *isa, int f32_act);

/* ---- the row-panel layout of Q4_0 and Q4_1 (CPU engines) ----
 * The stored layout keeps each block's scale beside its quants, so a
 * one-row GEMV spends most of its instructions moving scales into the
 * lanes of their block (the GEMV above: ~16 vector uops for 4 blocks).
 * In panels the bytes of QMM_PANEL_ROWS consecutive weight rows are
 * interleaved by block column: for column b, four 64-byte vectors (vector
 * s holds quant bytes 4s..4s+3 of row r in lane r), then the 16 rows' f16
 * d, then (Q4_1) their f16 m: the same bytes as the 16 blocks, in another
 * order. A decode step then takes 16 rows' blocks a column at a time, one
 * lane a row: 8 vpdpbusd against x's quant bytes broadcast, the scales
 * converted 16 at once, no horizontal sums (~28 uops for 16 blocks).
 * Every other path (the GEMM, the four-row and portable kernels, f32
 * activations) reads panels as rows of stored blocks through
 * kiln_qmm_panel_block. A weight in panels has n a multiple of 16. */
#define QMM_PANEL_ROWS 16
/* The longest row (bytes) a weight in panels may have: the kernels that
 * read stored rows get them from panels into a buffer this size on the
 * stack. */
#define QMM_PANEL_ROW_BYTES 32768

/* 1 where f has the panel layout (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K). */
int kiln_qmm_panel_format(const qmm_format *f);
/* n rows of k values in the stored layout (w) into panels (out, as many
 * bytes); n a multiple of QMM_PANEL_ROWS. */
void kiln_qmm_panel_pack(const qmm_format *f, const uint8_t *w, int64_t n, int32_t k, uint8_t *out);
/* Block b of row r of the weight in panels at w (rows wrow bytes) as
 * stored: f->bytes bytes at out. */
void kiln_qmm_panel_block(const qmm_format *f, const uint8_t *w, size_t wrow, int64_t r, int32_t b, uint8_t *out);
/* Rows [r0, r0 + count) of a weight in panels, as stored, into out. */
void kiln_qmm_panel_rows(const qmm_format *f, const uint8_t *w, size_t wrow, int64_t r0, int64_t count, uint8_t *out);
/* y[r] = w_r · x for the 16 · n_panels rows in panels at w, x one row of
 * quantized activations (kiln_qmm_quantize_row). */
typedef void (*qmm_panel_fn)(const uint8_t *w, size_t wrow, int64_t n_panels, int32_t k, const void *xq, float *y);
/* The panel GEMV for f, or NULL: formats without panels, isa "c" or
 * "avx2", f32 activations, or a CPU without AVX-512 VNNI. Q6_K's GEMV builds
 * its 6-bit values with GFNI where the CPU has it (not with isa "avx512").
 * Each line of the panels is asked for twice before the kernel reads it:
 * into L1 with the next columns, and into L2 16 KiB ahead (QMM_PANEL_FAR
 * in qmatmul_cpu.c). */
qmm_panel_fn kiln_qmm_panel_pick(const qmm_format *f, const char *isa, int f32_act);

#endif
