/* The paged KV cache's block allocator: a free list of block indices and
 * per-sequence block tables (docs/llm.md: block_table row j holds the cache
 * block of a sequence's j-th block_size tokens). The cache memory itself is
 * the engine's kv_cache.<layer> tensors; this only hands out indices.
 * Nothing here allocates after kiln_kv_pool_init. Not thread-safe. */
#ifndef KILN_LLM_KV_CACHE_H
#define KILN_LLM_KV_CACHE_H

#include <kiln/status.h>
#include <stdint.h>

typedef struct kiln_kv_pool {
    int32_t n_blocks, block_size;
    int32_t *free_list; /* stack of free block indices */
    int32_t n_free;
} kiln_kv_pool;

/* A sequence's blocks: blocks[0..n_blocks) in token order, in caller
 * storage of `cap` entries (a row of the step's block_table). */
typedef struct kiln_kv_seq {
    int32_t *blocks;
    int32_t n_blocks, cap;
} kiln_kv_seq;

kiln_status kiln_kv_pool_init(kiln_kv_pool *pool, int32_t n_blocks, int32_t block_size);
/* NULL-safe; frees the free list. */
void kiln_kv_pool_free(kiln_kv_pool *pool);

/* Blocks needed for n_tokens (ceil(n_tokens / block_size)). */
int32_t kiln_kv_blocks_for(const kiln_kv_pool *pool, int64_t n_tokens);

void kiln_kv_seq_init(kiln_kv_seq *seq, int32_t *storage, int32_t cap);

/* Grows seq to hold n_tokens, taking blocks from the pool. KILN_ERROR_LIMIT
 * (seq unchanged) when the pool lacks blocks or the table is full, naming
 * the numbers. */
kiln_status kiln_kv_seq_grow(kiln_kv_pool *pool, kiln_kv_seq *seq, int64_t n_tokens);

/* Returns all of seq's blocks to the pool. */
void kiln_kv_seq_release(kiln_kv_pool *pool, kiln_kv_seq *seq);

#endif
