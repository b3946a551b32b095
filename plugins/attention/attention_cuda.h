/* PagedAttention on the CUDA backend (attention_cuda.cu): the boundary
 * between the plugin's host code (attention.c) and its kernels. Plain C
 * types; compiled in only when CMake finds nvcc (KILN_HAVE_CUDA). */
#ifndef KILN_PLUGINS_ATTENTION_CUDA_H
#define KILN_PLUGINS_ATTENTION_CUDA_H

#include <kiln/types.h>

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One step's attention. q, k and v point at head 0 of token 0 and their
 * rows are q_ld, k_ld and v_ld elements apart (separate tensors, or the
 * three parts of one packed qkv row). Pointers are device memory. */
typedef struct kat_args {
    const void *q, *k, *v;
    int64_t q_ld, k_ld, v_ld;
    void *cache;                   /* [n_blocks, 2, n_kv_heads, block_size, head_dim] */
    void *out;                     /* [tokens, n_heads * head_dim] */
    const int32_t *table;          /* [n_seqs, max_blocks] */
    const int32_t *seq_lens;       /* [n_seqs] */
    const int32_t *qstart;         /* [n_seqs + 1] */
    void *workspace;               /* kat_workspace_size() bytes for the max shapes */
    int64_t tokens, n_seqs, max_blocks, n_blocks;
    int32_t n_heads, n_kv_heads, head_dim, block_size;
    float scale;
    int32_t dtype;                 /* of q, k, v, the cache and out (f32, f16, bf16) */
} kat_args;

/* Device scratch bytes a step of at most `tokens` tokens, `n_seqs`
 * sequences and `max_blocks` blocks per sequence needs (the split partial
 * results of decode). Depends on shapes alone. */
size_t kat_workspace_size(int64_t tokens, int64_t n_seqs, int64_t max_blocks, int32_t n_heads, int32_t n_kv_heads,
                          int32_t head_dim, int32_t block_size);

/* Launches the cache write and the attention on `stream` (a cudaStream_t):
 * only launches, no allocation, no synchronization, no reads of device
 * data on the host. Returns a cudaError_t (0 on success); a step that needs
 * a workspace but got none is cudaErrorInvalidValue. */
int kat_launch(const kat_args *a, void *stream);

/* Text of a code kat_launch returned. */
const char *kat_error_string(int code);

#ifdef __cplusplus
}
#endif

#endif
