/* One ggml quantized block to f32, one function per format, written once
 * for the GGUF reader (kiln_ggml_dequantize), the CPU QuantMatMul reference
 * path and any GPU kernel (KILN_HD: `static inline` in C, host and device
 * under nvcc).
 *
 * Layouts are those of ggml (ggml-common.h), as the `gguf` Python package
 * decodes them (test_gguf.c compares bit for bit): every scale is an f16
 * (Q6_K's sub-scales are int8). In the 32-element formats element j sits
 * in the low nibble of qs[j] and element j + 16 in its high nibble; Q5_0
 * and Q5_1 keep the fifth bit of element j in bit j of the little-endian
 * 32-bit qh. The K formats are super-blocks of 256 in sub-blocks of 32
 * (Q4_K, Q5_K: a 6-bit scale and min each, packed in 12 bytes) or 16
 * (Q6_K: an int8 scale each); their 4-bit parts store sub-block 2i in the
 * low and 2i + 1 in the high nibbles of the same 32 bytes.
 *
 * Each weight is formed as ggml and the gguf package form it: the scale
 * product first (d · sc), then · q, then the min added or subtracted, as
 * separate roundings (host C is compiled without FP contraction, so no FMA
 * merges them; device code must keep that too). */
#ifndef KILN_CORE_GGML_BLOCK_H
#define KILN_CORE_GGML_BLOCK_H

#include <stdint.h>

#include "core/scalar.h"

KILN_HD float kiln_ggml_f16_at(const uint8_t *p) { return kiln_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

/* Q8_0, 34 bytes: d, qs[32] int8. w = d·q */
KILN_HD void kiln_ggml_block_q8_0(const uint8_t *b, float *y)
{
    float d = kiln_ggml_f16_at(b);
    for (int j = 0; j < 32; j++)
        y[j] = d * (float)(int8_t)b[2 + j];
}

/* Q4_0, 18 bytes: d, qs[16]. w = d·(q - 8) */
KILN_HD void kiln_ggml_block_q4_0(const uint8_t *b, float *y)
{
    float d = kiln_ggml_f16_at(b);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((b[2 + j] & 0x0F) - 8);
        y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
    }
}

/* Q4_1, 20 bytes: d, m, qs[16]. w = d·q + m */
KILN_HD void kiln_ggml_block_q4_1(const uint8_t *b, float *y)
{
    float d = kiln_ggml_f16_at(b), m = kiln_ggml_f16_at(b + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(b[4 + j] & 0x0F) + m;
        y[j + 16] = d * (float)(b[4 + j] >> 4) + m;
    }
}

/* The 5-bit value j of a Q5 block: qh (4 bytes) then qs (16 bytes). */
KILN_HD int kiln_ggml_q5_value(const uint8_t *qh, const uint8_t *qs, int j)
{
    int lo = j < 16 ? (qs[j] & 0x0F) : (qs[j - 16] >> 4);
    return lo | ((qh[j >> 3] >> (j & 7)) & 1) << 4;
}

/* Q5_0, 22 bytes: d, qh[4], qs[16]. w = d·(q - 16) */
KILN_HD void kiln_ggml_block_q5_0(const uint8_t *b, float *y)
{
    float d = kiln_ggml_f16_at(b);
    for (int j = 0; j < 32; j++)
        y[j] = d * (float)(kiln_ggml_q5_value(b + 2, b + 6, j) - 16);
}

/* Q5_1, 24 bytes: d, m, qh[4], qs[16]. w = d·q + m */
KILN_HD void kiln_ggml_block_q5_1(const uint8_t *b, float *y)
{
    float d = kiln_ggml_f16_at(b), m = kiln_ggml_f16_at(b + 2);
    for (int j = 0; j < 32; j++)
        y[j] = d * (float)kiln_ggml_q5_value(b + 4, b + 8, j) + m;
}

/* Scale and min of sub-block j (0..7) from the 12 packed bytes of Q4_K and
 * Q5_K: j < 4 in the low 6 bits of bytes j and j + 4; j >= 4 from a nibble
 * of byte j + 4 and the top 2 bits of bytes j - 4 and j. */
KILN_HD void kiln_ggml_kscale(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0x0F) | (s[j - 4] >> 6) << 4;
        *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

/* Q4_K, 144 bytes: d, dmin, scales[12], qs[128]. w = (d·sc)·q - dmin·m */
KILN_HD void kiln_ggml_block_q4_k(const uint8_t *b, float *y)
{
    float d = kiln_ggml_f16_at(b), dmin = kiln_ggml_f16_at(b + 2);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        kiln_ggml_kscale(b + 4, j, &sc, &m);
        float ds = d * (float)sc, dm = dmin * (float)m;
        const uint8_t *qs = b + 16 + 32 * (j >> 1);
        for (int l = 0; l < 32; l++)
            y[32 * j + l] = ds * (float)((j & 1) ? qs[l] >> 4 : qs[l] & 0x0F) - dm;
    }
}

/* Q5_K, 176 bytes: d, dmin, scales[12], qh[32], qs[128]; the fifth bit of
 * element l of sub-block j is bit j of qh[l]. w = (d·sc)·q - dmin·m */
KILN_HD void kiln_ggml_block_q5_k(const uint8_t *b, float *y)
{
    float d = kiln_ggml_f16_at(b), dmin = kiln_ggml_f16_at(b + 2);
    const uint8_t *qh = b + 16;
    for (int j = 0; j < 8; j++) {
        int sc, m;
        kiln_ggml_kscale(b + 4, j, &sc, &m);
        float ds = d * (float)sc, dm = dmin * (float)m;
        const uint8_t *qs = b + 48 + 32 * (j >> 1);
        for (int l = 0; l < 32; l++) {
            int q = ((j & 1) ? qs[l] >> 4 : qs[l] & 0x0F) | ((qh[l] >> j) & 1) << 4;
            y[32 * j + l] = ds * (float)q - dm;
        }
    }
}

/* The 6-bit value of element e (0..255) of a Q6_K block, minus 32: in each
 * half of 128, element 32s + l has its low nibble in ql[l + 32(s & 1)]
 * (high nibble when s >= 2) and its top 2 bits at bit 2s of qh[l]. */
KILN_HD int kiln_ggml_q6k_value(const uint8_t *b, int e)
{
    const uint8_t *ql = b + 64 * (e >> 7), *qh = b + 128 + 32 * (e >> 7);
    int s = (e >> 5) & 3, l = e & 31;
    int lo = s < 2 ? ql[l + 32 * s] & 0x0F : ql[l + 32 * (s - 2)] >> 4;
    return (lo | ((qh[l] >> (2 * s)) & 3) << 4) - 32;
}

/* Q6_K, 210 bytes: ql[128], qh[64], scales[16] int8 (one per 16), d.
 * w = (d·sc)·q */
KILN_HD void kiln_ggml_block_q6_k(const uint8_t *b, float *y)
{
    float d = kiln_ggml_f16_at(b + 208);
    for (int e = 0; e < 256; e++)
        y[e] = d * (float)(int8_t)b[192 + e / 16] * (float)kiln_ggml_q6k_value(b, e);
}

#endif
