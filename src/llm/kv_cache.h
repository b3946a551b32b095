/* The paged KV cache's block allocator: block indices handed to sequences
 * (docs/llm.md: block_table row j holds the cache block of a sequence's
 * j-th block_size tokens), with reference counts so that sequences can
 * share the blocks of a common prompt prefix (prefix caching,
 * docs/scheduling.md). The cache memory itself is the engine's
 * kv_cache.<layer> tensors; this only hands out indices.
 *
 * Prefix caching: a full block may be registered under the chain hash of
 * its tokens (XXH64 of the block's ids seeded with the hash of the block
 * before it). A registered block whose last holder lets go is not freed
 * but kept, evictable, in least-recently-released order; a sequence that
 * starts with the same tokens takes it again (kiln_kv_seq_match) instead of
 * recomputing it. Taking a block for growth uses a never-cached block
 * first and evicts the least recently released cached one after that.
 * Nothing here allocates after kiln_kv_pool_init and
 * kiln_kv_pool_set_caching. Not thread-safe. */
#ifndef KILN_LLM_KV_CACHE_H
#define KILN_LLM_KV_CACHE_H

#include <kiln/status.h>
#include <stdint.h>

typedef struct kiln_kv_pool {
    int32_t n_blocks, block_size;
    int32_t *free_list; /* stack of blocks that hold nothing reusable */
    int32_t n_free;
    int32_t *ref; /* [n_blocks] sequences holding each block */
    /* Prefix cache (NULL arrays while off). */
    int32_t caching;
    uint64_t *hash;    /* [n_blocks] chain hash of a registered block */
    int32_t *parent;   /* [n_blocks] the block before it in its chain, -1 for a first block */
    int32_t *tokens;   /* [n_blocks, block_size] its ids, compared on every match */
    uint8_t *in_table; /* [n_blocks] registered */
    int32_t *chain;    /* [n_blocks] next block in the same hash bucket */
    int32_t *buckets;  /* [bucket_mask + 1] first block of each bucket, -1: empty */
    uint32_t bucket_mask;
    int32_t *lru_prev, *lru_next; /* [n_blocks] the evictable list, oldest first */
    int32_t lru_head, lru_tail, n_lru;
} kiln_kv_pool;

/* A sequence's blocks: blocks[0..n_blocks) in token order, in caller
 * storage of `cap` entries (a row of the step's block_table). */
typedef struct kiln_kv_seq {
    int32_t *blocks;
    int32_t n_blocks, cap;
} kiln_kv_seq;

kiln_status kiln_kv_pool_init(kiln_kv_pool *pool, int32_t n_blocks, int32_t block_size);
/* NULL-safe; frees everything the pool holds. */
void kiln_kv_pool_free(kiln_kv_pool *pool);

/* Turns prefix caching on (allocating its tables once) or off (dropping
 * every cached block back to the free list). */
kiln_status kiln_kv_pool_set_caching(kiln_kv_pool *pool, int32_t on);

/* Blocks a sequence can take now: free plus evictable. */
static inline int32_t kiln_kv_pool_available(const kiln_kv_pool *pool) { return pool->n_free + pool->n_lru; }

/* Blocks needed for n_tokens (ceil(n_tokens / block_size)). */
int32_t kiln_kv_blocks_for(const kiln_kv_pool *pool, int64_t n_tokens);

void kiln_kv_seq_init(kiln_kv_seq *seq, int32_t *storage, int32_t cap);

/* Grows seq to hold n_tokens, taking fresh blocks (free ones first, then
 * evicting cached ones). KILN_ERROR_LIMIT (seq unchanged) when the pool
 * lacks blocks or the table is full, naming the numbers. */
kiln_status kiln_kv_seq_grow(kiln_kv_pool *pool, kiln_kv_seq *seq, int64_t n_tokens);

/* Lets go of all of seq's blocks: a block nobody else holds is freed, or
 * kept evictable when it is registered. */
void kiln_kv_seq_release(kiln_kv_pool *pool, kiln_kv_seq *seq);

/* The chain hash of a block of ids following a block whose hash is
 * `parent` (0 for the first block). */
uint64_t kiln_kv_block_hash(uint64_t parent, const int32_t *ids, int32_t n);

/* For an empty seq: takes the registered blocks that hold ids[0..), block
 * by block, while every id of the block matches, up to max_blocks blocks.
 * hashes[j] receives block j's chain hash. Returns the blocks taken (0
 * when caching is off). */
int32_t kiln_kv_seq_match(kiln_kv_pool *pool, kiln_kv_seq *seq, const int32_t *ids, int32_t max_blocks,
                          uint64_t *hashes);

/* Registers seq's block j, now full with ids (block_size of them), under
 * `hash` so later sequences can share it; a no-op when caching is off or
 * an equal block is registered already. */
void kiln_kv_seq_register(kiln_kv_pool *pool, const kiln_kv_seq *seq, int32_t j, uint64_t hash, const int32_t *ids);

#endif
