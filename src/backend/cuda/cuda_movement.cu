/* Data-movement kernels: strided copies (slice, shuffle), concat bands,
 * gather and cast. Copies are templated on the element size only. */
#include "backend/cuda/cuda_common.cuh"

template <typename E>
__global__ void kcu_copy_kernel(const E *src, E *dst, int64_t count, int64_t base, const kcu_map dm, const kcu_map sm)
{
    KTL_SCOPE(0);
    kcu_after_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        int64_t off = kcu_map_off(dm, i);
        if (sm.rank > 0)
            off = kcu_map_off(sm, off);
        dst[i] = src[base + off];
    }
}

template <typename E>
__global__ void kcu_band_kernel(const E *src, E *dst, int64_t rows, int64_t width, int64_t pitch, int64_t col)
{
    KTL_SCOPE(0);
    kcu_after_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x, n = rows * width;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[(i / width) * pitch + col + i % width] = src[i];
}

template <typename E, typename I>
__global__ void kcu_gather_kernel(const E *data, const I *idx, E *out, int64_t outer, int64_t n_idx, int64_t inner,
                                  int64_t dim, kcu_error_word *err, kcu_error_word *report, int layer)
{
    KTL_SCOPE(0);
    kcu_after_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x, n = outer * n_idx * inner;
    for (int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; o < n; o += stride) {
        int64_t c = o % inner, j = (o / inner) % n_idx, i = o / (inner * n_idx);
        int64_t v = (int64_t)idx[j];
        if (v < 0 || v >= dim) {
            if (atomicCAS(&err->flag, 0, 1) == 0) { /* the first error is reported */
                report->layer = layer;
                report->index = v;
                report->position = j;
                __threadfence_system();
                *(volatile int32_t *)&report->flag = 1;
            }
            v = v < 0 ? 0 : dim - 1;
        }
        out[o] = data[(i * dim + v) * inner + c];
    }
}

#define KCU_BY_ESIZE(esize, MACRO) \
    switch (esize) { \
    case 1: MACRO(uint8_t); break; \
    case 2: MACRO(uint16_t); break; \
    case 4: MACRO(uint32_t); break; \
    case 8: MACRO(uint64_t); break; \
    default: return (int)cudaErrorInvalidValue; \
    }

extern "C" int kcu_launch_copy(const void *src, void *dst, int64_t count, int64_t base, const kcu_map *dst_map,
                               const kcu_map *src_map, int32_t esize, int32_t sms, void *stream)
{
    if (count <= 0)
        return cudaSuccess;
    unsigned blocks = kcu_blocks(count, sms, 4);
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t err = cudaSuccess;
#define KCU_LAUNCH_COPY(E) \
    err = kcu_launch(kcu_copy_kernel<E>, blocks, s, (const E *)src, (E *)dst, count, base, *dst_map, *src_map)
    KCU_BY_ESIZE(esize, KCU_LAUNCH_COPY)
#undef KCU_LAUNCH_COPY
    return (int)err;
}

extern "C" int kcu_launch_band(const void *src, void *dst, int64_t rows, int64_t width, int64_t pitch, int64_t col,
                               int32_t esize, int32_t sms, void *stream)
{
    if (rows <= 0 || width <= 0)
        return cudaSuccess;
    unsigned blocks = kcu_blocks(rows * width, sms, 4);
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t err = cudaSuccess;
#define KCU_LAUNCH_BAND(E) \
    err = kcu_launch(kcu_band_kernel<E>, blocks, s, (const E *)src, (E *)dst, rows, width, pitch, col)
    KCU_BY_ESIZE(esize, KCU_LAUNCH_BAND)
#undef KCU_LAUNCH_BAND
    return (int)err;
}

extern "C" int kcu_launch_gather(const void *data, const void *idx, int32_t idx_is_i64, void *out, int64_t outer,
                                 int64_t n_idx, int64_t inner, int64_t dim, int32_t esize, kcu_error_word *err,
                                 kcu_error_word *report, int32_t layer, int32_t sms, void *stream)
{
    if (outer <= 0 || n_idx <= 0 || inner <= 0)
        return cudaSuccess;
    unsigned blocks = kcu_blocks(outer * n_idx * inner, sms, 4);
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t e = cudaSuccess;
#define KCU_LAUNCH_GATHER(E) \
    e = idx_is_i64 ? kcu_launch(kcu_gather_kernel<E, int64_t>, blocks, s, (const E *)data, (const int64_t *)idx, \
                                (E *)out, outer, n_idx, inner, dim, err, report, (int)layer) \
                   : kcu_launch(kcu_gather_kernel<E, int32_t>, blocks, s, (const E *)data, (const int32_t *)idx, \
                                (E *)out, outer, n_idx, inner, dim, err, report, (int)layer)
    KCU_BY_ESIZE(esize, KCU_LAUNCH_GATHER)
#undef KCU_LAUNCH_GATHER
    return (int)e;
}

/* Integers convert exactly between themselves (f32 would lose bits of large
 * i32/i64 values); everything else goes through f32, as kiln_convert. */
__global__ void kcu_cast_kernel(const void *src, int st, void *dst, int dt, int64_t n)
{
    KTL_SCOPE(0);
    kcu_after_prior();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int ints = kiln_dtype_is_int_or_bool(st) && kiln_dtype_is_int_or_bool(dt);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        if (ints)
            kiln_elem_store_clamp(dst, dt, i, kiln_elem_load_int(src, st, i));
        else
            kcu_store(dst, dt, i, kcu_load(src, st, i));
    }
}

extern "C" int kcu_launch_cast(const void *src, int32_t src_dtype, void *dst, int32_t dst_dtype, int64_t n, int32_t sms,
                               void *stream)
{
    if (n <= 0)
        return cudaSuccess;
    return (int)kcu_launch(kcu_cast_kernel, kcu_blocks(n, sms, 4), (cudaStream_t)stream, src, (int)src_dtype, dst,
                           (int)dst_dtype, n);
}
