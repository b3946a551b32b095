/* ScaleBias: y = scale * x + bias, elementwise — a complete kiln plugin.
 *
 * It is built against <kiln/plugin.h> alone and links against nothing from
 * kiln: everything it calls on the host arrives in the kiln_host_api table
 * handed to kiln_plugin_library_init. One cc line builds it:
 *
 *     cc -std=c11 -O2 -fPIC -shared -Iinclude examples/scale_bias/scale_bias.c \
 *        -o libkiln_scale_bias.so
 *
 * Inputs:  x, f32 / f16 / bf16, any shape.
 * Outputs: y, same shape and dtype as x.
 * Fields:  scale (f32, 1 value, required), bias (f32, 1 value, required).
 * Blob:    schema version 1 = scale, bias as little-endian f32 (8 bytes).
 * Backends: CPU (f16/bf16 are computed in f32); CUDA too when CMake finds
 * nvcc and compiles scale_bias_cuda.cu in (KILN_SCALE_BIAS_CUDA), where
 * enqueue launches a vectorized kernel on the context's stream.
 */
#include <kiln/plugin.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The identity the registry and the engine file know the plugin by. The
 * test suite compiles this file with other values (tests/plugins/) to get
 * libraries that clash with it or write other blob versions, which is the
 * only reason these are overridable. */
#ifndef SCALE_BIAS_NAME
#define SCALE_BIAS_NAME "ScaleBias"
#endif
#ifndef SCALE_BIAS_VERSION
#define SCALE_BIAS_VERSION "1"
#endif
#ifndef SCALE_BIAS_NAMESPACE
#define SCALE_BIAS_NAMESPACE ""
#endif
#ifndef SCALE_BIAS_BLOB_VERSION
#define SCALE_BIAS_BLOB_VERSION 1u
#endif

#define SCALE_BIAS_BLOB_SIZE 8u

#ifdef KILN_SCALE_BIAS_CUDA
/* scale_bias_cuda.cu: launches y = scale * x + bias on a cudaStream_t and
 * returns the cudaError_t of the launch (0 on success). */
int scale_bias_cuda_launch(const void *x, void *y, int dtype, int64_t n, float scale, float bias, void *stream);
const char *scale_bias_cuda_error(int code);
#define SCALE_BIAS_BACKENDS (KILN_BACKEND_BIT(KILN_BACKEND_CPU) | KILN_BACKEND_BIT(KILN_BACKEND_CUDA))
#define SCALE_BIAS_BACKEND_NAMES "CPU and CUDA backends"
#else
#define SCALE_BIAS_BACKENDS KILN_BACKEND_BIT(KILN_BACKEND_CPU)
#define SCALE_BIAS_BACKEND_NAMES "CPU backend"
#endif

/* Set once by kiln_plugin_library_init; the host outlives every instance. */
static const kiln_host_api *host;

typedef struct scale_bias {
    kiln_plugin base; /* first, so a kiln_plugin * is a scale_bias * */
    float scale;
    float bias;
} scale_bias;

static const kiln_plugin_ops scale_bias_ops;

static kiln_status scale_bias_new(float scale, float bias, kiln_plugin **out)
{
    scale_bias *p = malloc(sizeof *p);
    if (!p)
        return host->fail(KILN_ERROR_OUT_OF_MEMORY, "ScaleBias: out of memory");
    p->base.struct_size = sizeof(kiln_plugin);
    p->base.abi_version = KILN_PLUGIN_ABI_VERSION;
    p->base.ops = &scale_bias_ops;
    p->scale = scale;
    p->bias = bias;
    *out = &p->base;
    return KILN_OK;
}

/* ---- shapes and types ------------------------------------------------------ */

static int32_t scale_bias_num_outputs(const kiln_plugin *self) { return 1; }

static kiln_status scale_bias_output_shapes(const kiln_plugin *self, const kiln_shape_expr *inputs, int32_t n_inputs,
                                            kiln_shape_expr *outputs, int32_t n_outputs, kiln_expr_builder *eb)
{
    if (n_inputs != 1 || n_outputs != 1)
        return host->fail(KILN_ERROR_SHAPE, "ScaleBias takes 1 input and gives 1 output, got %d and %d", (int)n_inputs,
                          (int)n_outputs);
    /* Elementwise: the output is the input's shape, expressions and all. */
    outputs[0] = inputs[0];
    return KILN_OK;
}

static int is_supported_dtype(kiln_dtype t)
{
    return t == KILN_DTYPE_F32 || t == KILN_DTYPE_F16 || t == KILN_DTYPE_BF16;
}

static kiln_status scale_bias_output_dtypes(const kiln_plugin *self, const kiln_dtype *inputs, int32_t n_inputs,
                                            kiln_dtype *outputs, int32_t n_outputs)
{
    if (n_inputs != 1 || n_outputs != 1)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "ScaleBias takes 1 input and gives 1 output, got %d and %d",
                          (int)n_inputs, (int)n_outputs);
    if (!is_supported_dtype(inputs[0]))
        return host->fail(KILN_ERROR_UNSUPPORTED, "ScaleBias: input dtype %d is not f32, f16 or bf16", (int)inputs[0]);
    outputs[0] = inputs[0];
    return KILN_OK;
}

static int32_t scale_bias_supports(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *descs,
                                   int32_t n_inputs, int32_t n_outputs)
{
    return (unsigned)backend < 32u && (SCALE_BIAS_BACKENDS & KILN_BACKEND_BIT(backend)) && n_inputs == 1 &&
           n_outputs == 1 && is_supported_dtype(descs[0].dtype) && descs[1].dtype == descs[0].dtype &&
           descs[0].format == KILN_FORMAT_LINEAR && descs[1].format == KILN_FORMAT_LINEAR;
}

/* ---- execution ------------------------------------------------------------- */

typedef struct scale_bias_job {
    const void *x;
    void *y;
    kiln_dtype dtype;
    float scale, bias;
} scale_bias_job;

static void scale_bias_chunk(void *arg, int64_t begin, int64_t end)
{
    const scale_bias_job *j = arg;
    switch (j->dtype) {
    case KILN_DTYPE_F32: {
        const float *x = j->x;
        float *y = j->y;
        for (int64_t i = begin; i < end; i++)
            y[i] = j->scale * x[i] + j->bias;
        break;
    }
    case KILN_DTYPE_F16: {
        const uint16_t *x = j->x;
        uint16_t *y = j->y;
        for (int64_t i = begin; i < end; i++)
            y[i] = host->float_to_half(j->scale * host->half_to_float(x[i]) + j->bias);
        break;
    }
    case KILN_DTYPE_BF16: {
        const uint16_t *x = j->x;
        uint16_t *y = j->y;
        for (int64_t i = begin; i < end; i++)
            y[i] = host->float_to_bf16(j->scale * host->bf16_to_float(x[i]) + j->bias);
        break;
    }
    default: break; /* enqueue refused every other dtype */
    }
}

static kiln_status scale_bias_enqueue(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *input_descs,
                                      const void *const *inputs, int32_t n_inputs, const kiln_tensor_desc *output_descs,
                                      void *const *outputs, int32_t n_outputs, void *workspace, void *stream)
{
    const scale_bias *p = (const scale_bias *)self;
    if ((unsigned)backend >= 32u || !(SCALE_BIAS_BACKENDS & KILN_BACKEND_BIT(backend)))
        return host->fail(KILN_ERROR_UNSUPPORTED, "ScaleBias runs on the %s only", SCALE_BIAS_BACKEND_NAMES);
    if (n_inputs != 1 || n_outputs != 1)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "ScaleBias takes 1 input and gives 1 output, got %d and %d",
                          (int)n_inputs, (int)n_outputs);
    const kiln_tensor_desc *in = &input_descs[0], *out = &output_descs[0];
    if (!is_supported_dtype(in->dtype) || out->dtype != in->dtype)
        return host->fail(KILN_ERROR_UNSUPPORTED, "ScaleBias: dtypes %d -> %d are not supported", (int)in->dtype,
                          (int)out->dtype);
    if (in->dims.rank != out->dims.rank || in->dims.rank < 0 || in->dims.rank > KILN_MAX_RANK)
        return host->fail(KILN_ERROR_SHAPE, "ScaleBias: input rank %d, output rank %d", (int)in->dims.rank,
                          (int)out->dims.rank);
    int64_t n = 1;
    for (int32_t i = 0; i < in->dims.rank; i++) {
        if (in->dims.d[i] != out->dims.d[i] || in->dims.d[i] < 0 || __builtin_mul_overflow(n, in->dims.d[i], &n))
            return host->fail(KILN_ERROR_SHAPE, "ScaleBias: dim %d is %lld in the input and %lld in the output", (int)i,
                              (long long)in->dims.d[i], (long long)out->dims.d[i]);
    }
#ifdef KILN_SCALE_BIAS_CUDA
    if (backend == KILN_BACKEND_CUDA) {
        int e = scale_bias_cuda_launch(inputs[0], outputs[0], (int)in->dtype, n, p->scale, p->bias, stream);
        if (e != 0)
            return host->fail(KILN_ERROR_BACKEND, "ScaleBias: kernel launch failed: %s", scale_bias_cuda_error(e));
        return KILN_OK;
    }
#endif
    scale_bias_job job = {inputs[0], outputs[0], in->dtype, p->scale, p->bias};
    host->parallel_for(stream, n, scale_bias_chunk, &job);
    return KILN_OK;
}

/* ---- state --------------------------------------------------------------- */

/* The blob is defined byte by byte (little-endian IEEE f32), so an engine
 * built on one machine reads the same on any other. */
static void put_f32(unsigned char *b, float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    for (int i = 0; i < 4; i++)
        b[i] = (unsigned char)(u >> (8 * i));
}

static float get_f32(const unsigned char *b)
{
    uint32_t u = 0;
    for (int i = 0; i < 4; i++)
        u |= (uint32_t)b[i] << (8 * i);
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static kiln_status scale_bias_serialize(const kiln_plugin *self, void *buf, size_t *size)
{
    const scale_bias *p = (const scale_bias *)self;
    if (!buf) {
        *size = SCALE_BIAS_BLOB_SIZE;
        return KILN_OK;
    }
    if (*size < SCALE_BIAS_BLOB_SIZE)
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "ScaleBias: blob buffer of %zu bytes, needs %u", *size,
                          SCALE_BIAS_BLOB_SIZE);
    put_f32(buf, p->scale);
    put_f32((unsigned char *)buf + 4, p->bias);
    *size = SCALE_BIAS_BLOB_SIZE;
    return KILN_OK;
}

static kiln_status scale_bias_clone(const kiln_plugin *self, kiln_plugin **out)
{
    const scale_bias *p = (const scale_bias *)self;
    return scale_bias_new(p->scale, p->bias, out);
}

static void scale_bias_destroy(kiln_plugin *self) { free(self); }

static const kiln_plugin_ops scale_bias_ops = {
    .struct_size = sizeof(kiln_plugin_ops),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    /* enqueue only computes: no allocation, no synchronization */
    .flags = KILN_PLUGIN_FLAG_CAPTURE_SAFE,
    .backends = SCALE_BIAS_BACKENDS,
    .num_outputs = scale_bias_num_outputs,
    .output_shapes = scale_bias_output_shapes,
    .output_dtypes = scale_bias_output_dtypes,
    .supports = scale_bias_supports,
    .workspace_size = NULL,
    .enqueue = scale_bias_enqueue,
    .serialize = scale_bias_serialize,
    .clone = scale_bias_clone,
    .destroy = scale_bias_destroy,
};

/* ---- the creator ----------------------------------------------------------- */

static const kiln_field_spec scale_bias_fields[] = {
    {.struct_size = sizeof(kiln_field_spec),
     .abi_version = KILN_PLUGIN_ABI_VERSION,
     .name = "scale",
     .type = KILN_FIELD_F32,
     .count = 1,
     .required = 1,
     .doc = "multiplies every element"},
    {.struct_size = sizeof(kiln_field_spec),
     .abi_version = KILN_PLUGIN_ABI_VERSION,
     .name = "bias",
     .type = KILN_FIELD_F32,
     .count = 1,
     .required = 1,
     .doc = "added after scaling"},
};

static kiln_status check_finite(const char *field, float v)
{
    if (!isfinite(v))
        return host->fail(KILN_ERROR_INVALID_ARGUMENT, "ScaleBias: field \"%s\" must be finite, got %g", field,
                          (double)v);
    return KILN_OK;
}

static kiln_status scale_bias_create(const kiln_plugin_creator *creator, const kiln_field *fields, int32_t n_fields,
                                     kiln_plugin **out)
{
    /* The host has checked names, types and counts and that both required
     * fields are present; what is left is checking the values. */
    float scale = 0.0f, bias = 0.0f;
    for (int32_t i = 0; i < n_fields; i++) {
        float v = *(const float *)fields[i].data;
        if (strcmp(fields[i].name, "scale") == 0)
            scale = v;
        else
            bias = v;
    }
    kiln_status s = check_finite("scale", scale);
    if (s == KILN_OK)
        s = check_finite("bias", bias);
    if (s != KILN_OK)
        return s;
    return scale_bias_new(scale, bias, out);
}

static kiln_status scale_bias_deserialize(const kiln_plugin_creator *creator, uint32_t blob_version, const void *blob,
                                          size_t size, kiln_plugin **out)
{
    if (blob_version != SCALE_BIAS_BLOB_VERSION)
        return host->fail(KILN_ERROR_VERSION, "ScaleBias blob schema version %u is %s than this plugin reads (%u)",
                          blob_version, blob_version > SCALE_BIAS_BLOB_VERSION ? "newer" : "older",
                          SCALE_BIAS_BLOB_VERSION);
    if (size != SCALE_BIAS_BLOB_SIZE)
        return host->fail(KILN_ERROR_FORMAT, "ScaleBias blob is %zu bytes, expected %u", size, SCALE_BIAS_BLOB_SIZE);
    float scale = get_f32(blob), bias = get_f32((const unsigned char *)blob + 4);
    kiln_status s = check_finite("scale", scale);
    if (s == KILN_OK)
        s = check_finite("bias", bias);
    if (s != KILN_OK)
        return s;
    return scale_bias_new(scale, bias, out);
}

static const kiln_plugin_creator scale_bias_creator = {
    .struct_size = sizeof(kiln_plugin_creator),
    .abi_version = KILN_PLUGIN_ABI_VERSION,
    .name = SCALE_BIAS_NAME,
    .version = SCALE_BIAS_VERSION,
    .plugin_namespace = SCALE_BIAS_NAMESPACE,
    .fields = scale_bias_fields,
    .n_fields = (int32_t)(sizeof scale_bias_fields / sizeof scale_bias_fields[0]),
    .blob_version = SCALE_BIAS_BLOB_VERSION,
    .create = scale_bias_create,
    .deserialize = scale_bias_deserialize,
#ifdef KILN_SCALE_BIAS_CUDA
    .description = "y = scale * x + bias, elementwise (f32, f16, bf16; CPU and CUDA)",
#else
    .description = "y = scale * x + bias, elementwise (f32, f16, bf16; CPU)",
#endif
};

KILN_PLUGIN_EXPORT kiln_status kiln_plugin_library_init(const kiln_host_api *host_api, kiln_registry *reg)
{
    /* A host older than the members used here cannot run this plugin. Only
     * the first members are safe to read before the size check. */
    if (host_api->struct_size < offsetof(kiln_host_api, float_to_bf16) + sizeof host_api->float_to_bf16) {
        if (host_api->struct_size >= offsetof(kiln_host_api, fail) + sizeof host_api->fail)
            return host_api->fail(KILN_ERROR_VERSION, "ScaleBias needs host API version 1, the host has %u",
                                  host_api->abi_version);
        return KILN_ERROR_VERSION;
    }
    host = host_api;
    return host->register_creator(reg, &scale_bias_creator);
}
