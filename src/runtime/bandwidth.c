/* kiln_backend_measure_copy_bandwidth (include/kiln/runtime.h): the copy
 * bandwidth a memory-bound step is compared with, measured in the process
 * of the benchmark it serves by the backend's own probe (copy_bandwidth in
 * its table); and kiln_backend_device_name, the device it was measured on. */
#include <kiln/kiln.h>

#include "backend/backend.h"
#include "core/error.h"

kiln_status kiln_backend_measure_copy_bandwidth(kiln_backend backend, size_t bytes, int32_t reps, double *bytes_per_s)
{
    if (!bytes_per_s || reps < 1 || reps > 64)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT,
                         "kiln_backend_measure_copy_bandwidth: reps %d must be in 1..64 and bytes_per_s set",
                         (int)reps);
    const kiln_backend_i *b = kiln_backend_find(backend);
    if (!b)
        return kiln_fail(KILN_ERROR_TARGET, "this kiln was built without the %s backend", kiln_backend_name(backend));
    if (!b->copy_bandwidth)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "the %s backend cannot measure its copy bandwidth",
                         kiln_backend_name(backend));
    return b->copy_bandwidth(bytes, reps, bytes_per_s);
}

kiln_status kiln_backend_device_name(kiln_backend backend, char *name, size_t size)
{
    if (!name || size == 0)
        return kiln_fail(KILN_ERROR_INVALID_ARGUMENT, "kiln_backend_device_name: no room for the name");
    name[0] = 0;
    const kiln_backend_i *b = kiln_backend_find(backend);
    if (!b)
        return kiln_fail(KILN_ERROR_TARGET, "this kiln was built without the %s backend", kiln_backend_name(backend));
    if (!b->device_name)
        return kiln_fail(KILN_ERROR_UNSUPPORTED, "the %s backend cannot name its device", kiln_backend_name(backend));
    return b->device_name(name, size);
}
