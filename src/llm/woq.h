/* Weight-only quantized matmul weights (kiln/WeightOnlyMatMul, plugins/woq/
 * woq.c): round-to-nearest quantization at build, and the AWQ and GPTQ
 * checkpoint layouts unpacked into kiln's. */
#ifndef KILN_LLM_WOQ_H
#define KILN_LLM_WOQ_H

#include <kiln/status.h>
#include <stdint.h>

/* One weight [n, k] in WeightOnlyMatMul's layout. */
typedef struct kiln_woq_weight {
    int32_t bits;   /* 8: w = s · q (q int8); 4: w = s · (q − z) */
    int32_t group;  /* values of a row per scale: a multiple of 32 dividing k */
    int64_t n, k;   /* k a multiple of 32 */
    uint8_t *q;     /* [n, k · bits / 8]; 4 bits: value 2j in the low nibble of byte j */
    float *scales;  /* [n, k / group] */
    uint8_t *zeros; /* [n, k / group], 0..15 (16 from a GPTQ v1 file); NULL for 8 bits */
} kiln_woq_weight;

/* Allocates the arrays of a weight (zeroed), checking bits, group and
 * shape (the error names `what`). */
kiln_status kiln_woq_alloc(kiln_woq_weight *w, int32_t bits, int32_t group, int64_t n, int64_t k, const char *what);

/* Frees the arrays; the struct is zeroed. NULL or a zeroed one is a no-op. */
void kiln_woq_free(kiln_woq_weight *w);

/* Bytes of q, of scales and of zeros. */
size_t kiln_woq_q_bytes(const kiln_woq_weight *w);
size_t kiln_woq_groups(const kiln_woq_weight *w);

/* Round-to-nearest quantization of f32 w [n, k] (row-major, a row per
 * output feature) into *out (allocated here). 8 bits: symmetric, s =
 * max|w| / 127 per group, q = round(w / s). 4 bits: asymmetric over the
 * group's range widened to hold 0 (so zero stays exact), s = (max − min)
 * / 15, z = round(−min / s), q = clamp(round(w / s) + z, 0, 15). */
kiln_status kiln_woq_quantize(const float *w, int64_t n, int64_t k, int32_t bits, int32_t group, const char *what,
                              kiln_woq_weight *out);

/* AutoAWQ's GEMM layout ("quant_method": "awq", "version": "gemm"), bits
 * 4: qweight int32 [k, n / 8] and qzeros int32 [k / group, n / 8], eight
 * output columns per word in the nibble order 0, 2, 4, 6, 1, 3, 5, 7
 * (nibble i, bits 4i, holds column 8c + order[i]); scales [k / group, n]
 * as f32 (converted by the caller from the file's f16). w = s · (q − z). */
kiln_status kiln_woq_from_awq(const int32_t *qweight, const int32_t *qzeros, const float *scales, int64_t n, int64_t k,
                              int32_t group, const char *what, kiln_woq_weight *out);

/* GPTQ's layout ("quant_method": "gptq", bits 4): qweight int32 [k / 8, n]
 * packed along k (nibble j of row r is input 8r + j), qzeros int32
 * [groups, n / 8] packed along n in order, scales [groups, n] (f32 from
 * the file's f16), g_idx [k] (NULL: input i is in group i / group) with
 * every input of a stored group of `group` consecutive inputs in the same
 * group. zero_offset is 1 for the original ("gptq", v1) checkpoint format,
 * which stores z − 1, and 0 for "gptq_v2". w = s · (q − z). Inputs whose
 * g_idx does not follow i / group (act-order checkpoints) are refused. */
kiln_status kiln_woq_from_gptq(const int32_t *qweight, const int32_t *qzeros, const float *scales, const int32_t *g_idx,
                               int64_t n, int64_t k, int32_t group, int32_t n_groups, int32_t zero_offset,
                               const char *what, kiln_woq_weight *out);

/* FP8 E4M3 weights for kiln/Fp8MatMul (plugins/fp8/fp8.c): per output
 * channel r, scales[r] = max|w[r, :]| / 448 and codes[r, i] =
 * e4m3(w[r, i] · (448 / max)), round to nearest even (src/core/fp8.h); a
 * row of zeros has scale 0. A NaN or infinity is refused, naming `what`. */
kiln_status kiln_fp8_quantize(const float *w, int64_t n, int64_t k, const char *what, uint8_t *codes, float *scales);

/* w (n rows of k) dequantized into f32 dst [n, k], the plugin's formula. */
void kiln_woq_dequantize(const kiln_woq_weight *w, float *dst);

#endif
