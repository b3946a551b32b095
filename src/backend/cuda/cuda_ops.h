/* What the host halves of the CUDA op families share (cuda_backend.c and
 * cuda_<family>.c): the device, checks of CUDA calls, shape arithmetic, and
 * each family's op entry, which validates a layer, computes launch
 * arguments and calls the family's launchers (cuda_internal.h). Op entries
 * only launch: no allocation, no synchronization. */
#ifndef KILN_BACKEND_CUDA_OPS_H
#define KILN_BACKEND_CUDA_OPS_H

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/layer_check.h"

#include "core/dtype.h"
#include "core/error.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

struct kiln_cuda_device {
    int ordinal;
    int32_t arch, sms;
    int64_t l2_bytes; /* the L2 cache's size */
    int32_t gemv;     /* small-m matmuls through kcu_gemv */
    cublasLtHandle_t lt;
    void *lt_workspace;  /* KILN_CUDA_CUBLASLT_WORKSPACE bytes */
    kcu_error_word *err; /* device memory: claimed with an atomic by the first error */
    /* the first error's record, written by the kernel that claimed err into
     * mapped pinned memory, so the check after a synchronize reads host
     * memory instead of making a synchronous device copy every step (its
     * cost alone was not measured) */
    kcu_error_word *report;     /* host address */
    kcu_error_word *report_dev; /* its device alias */
    struct mm_cache *mm;        /* cuBLASLt plans by problem (cuda_matmul.c) */
};

static inline const char *layer_name(const kiln_cuda_args *a)
{
    return a->layer && a->layer->name ? a->layer->name : "?";
}

static inline kiln_status cuda_fail(cudaError_t e, const char *who, const char *call, const char *file, int line)
{
    return kiln_fail(KILN_ERROR_BACKEND, "%s: %s failed: %s (%s:%d)", who, call, cudaGetErrorString(e), file, line);
}

/* Checks a CUDA runtime call; `who` names the layer or function. */
#define CU_CHECK(who, call) \
    do { \
        cudaError_t cu_e_ = (call); \
        if (cu_e_ != cudaSuccess) \
            return cuda_fail(cu_e_, (who), #call, __FILE__, __LINE__); \
    } while (0)

/* Checks a launcher's returned cudaError_t. */
#define KCU_CHECK(a, call) CU_CHECK(layer_name(a), (cudaError_t)(call))

/* ---- op entries, one per layer op ---- */

/* cuda_elementwise.c */
kiln_status cuda_run_binary(const kiln_cuda_args *a);
kiln_status cuda_run_unary(const kiln_cuda_args *a);
kiln_status cuda_run_fused(const kiln_cuda_args *a);
/* cuda_reduce.c */
kiln_status cuda_run_reduce(const kiln_cuda_args *a);
kiln_status cuda_run_softmax(const kiln_cuda_args *a);
/* cuda_movement.c */
kiln_status cuda_run_concat(const kiln_cuda_args *a);
kiln_status cuda_run_slice(const kiln_cuda_args *a);
kiln_status cuda_run_shuffle(const kiln_cuda_args *a);
kiln_status cuda_run_gather(const kiln_cuda_args *a);
kiln_status cuda_run_cast(const kiln_cuda_args *a);
/* cuda_matmul.c */
kiln_status cuda_run_matmul(const kiln_cuda_args *a);

#endif
