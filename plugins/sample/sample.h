/* What kiln/Sample's C side (sample.c) and its CUDA kernel (sample.cu)
 * share. */
#ifndef KILN_PLUGINS_SAMPLE_H
#define KILN_PLUGINS_SAMPLE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* top_k as the params row holds it (a float) to the sampler's int: <= 0
 * or NaN is off, beyond the vocabulary is all of it. */
#ifdef __CUDACC__
__host__ __device__
#endif
static inline int32_t sample_top_k(float k, int32_t vocab) {
    return k >= 1.0f ? (k < (float)vocab ? (int32_t)k : vocab) : 0;
}

/* Launches the sampling of S rows of V logits on `stream` (a cudaStream_t);
 * workspace holds S * V * 8 bytes. Returns 0, or the CUDA error of the
 * launch. */
int kiln_sample_cuda(const void *logits, const void *params, const void *random, void *ids, int32_t S, int32_t V,
                     void *workspace, void *stream);

#ifdef __cplusplus
}
#endif

#endif
