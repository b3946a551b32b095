/* kiln/plugin.h — the plugin ABI: the only header a plugin needs.
 *
 * A plugin library is a shared object that exports one symbol,
 *
 *     KILN_PLUGIN_EXPORT kiln_status
 *     kiln_plugin_library_init(const kiln_host_api *host, kiln_registry *reg);
 *
 * and calls host->register_creator() once per creator from it. Plugins never
 * link against libkiln: everything they may call on the host arrives in the
 * kiln_host_api table.
 *
 * ABI rules (pinned by tests/unit/test_abi_layout.c):
 * - Every struct that crosses the boundary begins with
 *   `uint32_t struct_size; uint32_t abi_version;`. A reader reads a member
 *   only if struct_size covers it.
 * - Members are only ever appended; existing offsets never move.
 * - kiln_field, kiln_field_spec and kiln_tensor_desc travel in arrays, read
 *   at this header's sizeof: their size is fixed for ABI version 1 (a new
 *   member for them means a new struct and a new ABI version).
 * - Enum values are append-only.
 *
 * Threads: creators may be called from any thread, one call at a time per
 * registry. A plugin instance is used by one thread at a time; the runtime
 * clones one instance per execution context, so enqueue may keep mutable
 * state in its instance without locks.
 */
#ifndef KILN_PLUGIN_H
#define KILN_PLUGIN_H

#include <kiln/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version of the structs in this header. Bumped when members are appended. */
#define KILN_PLUGIN_ABI_VERSION 1u

#define KILN_PLUGIN_EXPORT __attribute__((visibility("default")))

/* Name of the one symbol a plugin library exports. */
#define KILN_PLUGIN_INIT_SYMBOL "kiln_plugin_library_init"

typedef struct kiln_registry kiln_registry;         /* opaque, host-owned */
typedef struct kiln_expr_builder kiln_expr_builder; /* opaque, host-owned */

/* ---------------------------------------------------------------------------
 * Shape expressions
 *
 * At build time dims are not numbers but expressions of the network's
 * dynamic input dims. A plugin computes its output shapes from its input
 * shapes with the host's expression builder; the expressions are stored in
 * the engine and evaluated by the runtime whenever input shapes change.
 * ------------------------------------------------------------------------- */

/* Handle of an expression inside one kiln_expr_builder; < 0 is invalid. */
typedef int32_t kiln_expr;

typedef enum kiln_expr_op {
    KILN_EXPR_ADD = 0,
    KILN_EXPR_SUB,
    KILN_EXPR_MUL,
    KILN_EXPR_FLOOR_DIV, /* division by zero makes the shape invalid */
    KILN_EXPR_CEIL_DIV,
    KILN_EXPR_MAX,
    KILN_EXPR_MIN,
    KILN_EXPR_OP_COUNT
} kiln_expr_op;

typedef struct kiln_shape_expr {
    int32_t rank;
    kiln_expr d[KILN_MAX_RANK];
} kiln_shape_expr;

/* ---------------------------------------------------------------------------
 * Fields: the typed parameters a plugin is created from
 * ------------------------------------------------------------------------- */

typedef enum kiln_field_type {
    KILN_FIELD_F32 = 0,
    KILN_FIELD_F64,
    KILN_FIELD_I32,
    KILN_FIELD_I64,
    KILN_FIELD_STRING, /* data is a NUL-terminated char string; count is 1 */
    KILN_FIELD_TYPE_COUNT
} kiln_field_type;

/* One value handed to create(). data points at count elements of type
 * (or at one NUL-terminated string). Borrowed for the duration of the call. */
typedef struct kiln_field {
    uint32_t struct_size;
    uint32_t abi_version;
    const char *name;
    kiln_field_type type;
    int64_t count;
    const void *data;
} kiln_field;

/* Count of a field that accepts any number (>= 1) of elements. */
#define KILN_FIELD_ANY_COUNT (-1)

/* One entry of a creator's field schema. The host enforces the schema before
 * create() is called: an unknown name, a wrong type, a wrong count or a
 * missing required field is an error that names the plugin and the field.
 * Optional fields that were not given are passed to create() with their
 * default (default_data/default_count), or left out when default_data is
 * NULL. */
typedef struct kiln_field_spec {
    uint32_t struct_size;
    uint32_t abi_version;
    const char *name;
    kiln_field_type type;
    int64_t count; /* exact count, or KILN_FIELD_ANY_COUNT */
    int32_t required;
    int32_t reserved;
    const void *default_data;
    int64_t default_count;
    const char *doc; /* one line, shown by `kiln plugins` */
} kiln_field_spec;

/* ---------------------------------------------------------------------------
 * Plugin instances
 * ------------------------------------------------------------------------- */

typedef struct kiln_plugin kiln_plugin;

/* The plugin may be enqueued inside a CUDA graph capture: its enqueue does
 * no allocation, no synchronization and no host-side reads of device data. */
#define KILN_PLUGIN_FLAG_CAPTURE_SAFE 0x1u

/* Bit of kiln_plugin_ops.backends for a backend. */
#define KILN_BACKEND_BIT(b) (1u << (unsigned)(b))

typedef struct kiln_plugin_ops {
    uint32_t struct_size;
    uint32_t abi_version;

    /* KILN_PLUGIN_FLAG_* */
    uint32_t flags;
    /* KILN_BACKEND_BIT() of every backend enqueue() supports. */
    uint32_t backends;

    /* Number of outputs (>= 1). */
    int32_t (*num_outputs)(const kiln_plugin *self);

    /* Output shapes as expressions of the input shapes, built with
     * host->expr_constant / host->expr_operation on eb. Input expressions
     * may be used as they are. Returns KILN_OK or an error through
     * host->fail (e.g. wrong input rank). */
    kiln_status (*output_shapes)(const kiln_plugin *self, const kiln_shape_expr *inputs, int32_t n_inputs,
                                 kiln_shape_expr *outputs, int32_t n_outputs, kiln_expr_builder *eb);

    /* Output dtypes from input dtypes. */
    kiln_status (*output_dtypes)(const kiln_plugin *self, const kiln_dtype *inputs, int32_t n_inputs,
                                 kiln_dtype *outputs, int32_t n_outputs);

    /* Nonzero when enqueue() on `backend` accepts this combination of input
     * and output dtypes and formats (descs holds n_inputs then n_outputs
     * entries; dims in them are not meaningful here). */
    int32_t (*supports)(const kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *descs, int32_t n_inputs,
                        int32_t n_outputs);

    /* Scratch bytes enqueue() needs for these shapes. The builder asks at the
     * largest shapes of every profile and reserves the maximum. May be NULL
     * (no workspace). */
    size_t (*workspace_size)(const kiln_plugin *self, const kiln_tensor_desc *inputs, int32_t n_inputs,
                             const kiln_tensor_desc *outputs, int32_t n_outputs);

    /* Runs the plugin. On KILN_BACKEND_CPU `stream` is a host handle for
     * host->parallel_for and pointers are host memory; on KILN_BACKEND_CUDA
     * `stream` is a cudaStream_t and pointers are device memory. Must only
     * launch work: no allocation, no synchronization. */
    kiln_status (*enqueue)(kiln_plugin *self, kiln_backend backend, const kiln_tensor_desc *input_descs,
                           const void *const *inputs, int32_t n_inputs, const kiln_tensor_desc *output_descs,
                           void *const *outputs, int32_t n_outputs, void *workspace, void *stream);

    /* Writes the plugin's state. With buf NULL, stores the needed size in
     * *size. Otherwise *size is the capacity of buf; on success it is set to
     * the bytes written. The blob's schema version is the creator's
     * blob_version. */
    kiln_status (*serialize)(const kiln_plugin *self, void *buf, size_t *size);

    /* Deep copy: the clone shares no mutable state with self. */
    kiln_status (*clone)(const kiln_plugin *self, kiln_plugin **out);

    /* Frees the instance. */
    void (*destroy)(kiln_plugin *self);
} kiln_plugin_ops;

/* Every instance begins with this header; plugins embed it as the first
 * member of their own struct and cast. */
struct kiln_plugin {
    uint32_t struct_size;
    uint32_t abi_version;
    const kiln_plugin_ops *ops;
};

/* ---------------------------------------------------------------------------
 * Creators
 * ------------------------------------------------------------------------- */

typedef struct kiln_plugin_creator kiln_plugin_creator;

struct kiln_plugin_creator {
    uint32_t struct_size;
    uint32_t abi_version;

    /* The exact triple the registry keys on. Static strings. */
    const char *name;
    const char *version;
    const char *plugin_namespace;

    /* Field schema; static storage. */
    const kiln_field_spec *fields;
    int32_t n_fields;

    /* Schema version of the blobs serialize() writes and the newest one
     * deserialize() reads. Stored in the engine beside each blob. */
    uint32_t blob_version;

    /* Creates an instance from schema-checked fields (defaults filled in).
     * The plugin still checks values (e.g. a negative epsilon) and fails
     * through host->fail naming the field. */
    kiln_status (*create)(const kiln_plugin_creator *creator, const kiln_field *fields, int32_t n_fields,
                          kiln_plugin **out);

    /* Recreates an instance from a blob of schema version blob_version. A
     * plugin refuses a version it cannot read with KILN_ERROR_VERSION and a
     * message naming both versions. */
    kiln_status (*deserialize)(const kiln_plugin_creator *creator, uint32_t blob_version, const void *blob, size_t size,
                               kiln_plugin **out);

    /* One line describing the plugin, shown by `kiln plugins`. May be NULL. */
    const char *description;

    /* For the plugin's own use. */
    void *user_data;
};

/* ---------------------------------------------------------------------------
 * The host API
 * ------------------------------------------------------------------------- */

typedef void (*kiln_parallel_fn)(void *arg, int64_t begin, int64_t end);

typedef struct kiln_host_api {
    uint32_t struct_size;
    uint32_t abi_version;

    /* Registers a creator. The struct and everything it points at must stay
     * valid until the library is unloaded (static storage is typical).
     * Fails if the triple is already registered, naming both libraries. */
    kiln_status (*register_creator)(kiln_registry *reg, const kiln_plugin_creator *creator);

    /* Logs one message (printf format), level as kiln_log_level. */
    void (*log)(int32_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

    /* Records a one-line error message for the calling thread and returns
     * `status`, so a plugin writes `return host->fail(KILN_ERROR_..., ...)`. */
    kiln_status (*fail)(kiln_status status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

    /* Shape expressions (see kiln_plugin_ops.output_shapes). */
    kiln_expr (*expr_constant)(kiln_expr_builder *eb, int64_t value);
    kiln_expr (*expr_operation)(kiln_expr_builder *eb, kiln_expr_op op, kiln_expr a, kiln_expr b);
    /* Nonzero, with *value set, when e is a known constant. */
    int32_t (*expr_is_constant)(kiln_expr_builder *eb, kiln_expr e, int64_t *value);

    /* On the CPU backend: runs fn over [0, n) split into chunks on the
     * host's thread pool and returns when all are done. `stream` is the one
     * given to enqueue. */
    void (*parallel_for)(void *stream, int64_t n, kiln_parallel_fn fn, void *arg);

    /* f16/bf16 <-> f32 conversions, round to nearest even. */
    float (*half_to_float)(uint16_t h);
    uint16_t (*float_to_half)(float f);
    float (*bf16_to_float)(uint16_t b);
    uint16_t (*float_to_bf16)(float f);

    /* Dequantizes n values (whole blocks) stored in a ggml block format,
     * identified by its ggml/GGUF type number (2 Q4_0, 3 Q4_1, 8 Q8_0, 12
     * Q4_K, 14 Q6_K, ...), from src into f32 at dst, exactly as ggml
     * defines the format. KILN_ERROR_UNSUPPORTED (with a message) for a
     * format this host cannot dequantize, KILN_ERROR_INVALID_ARGUMENT when
     * n is not a whole number of blocks; n = 0 asks only whether the format
     * is supported. Present when struct_size covers it (kiln 0.1 after
     * 2026-12-01; older hosts' tables end before it). */
    kiln_status (*ggml_dequantize)(uint32_t type, const void *src, int64_t n, float *dst);

    /* From enqueue: the constants (weights) that the layers after this one
     * read, in the order they run, the first `budget` bytes of them in
     * all, as up to `max` ranges ptr[i], bytes[i] in the backend's memory
     * (device pointers on CUDA); returns how many. A layer that leaves the
     * memory idle (an attention bound by its arithmetic or its latency)
     * can ask the caches for them meanwhile, so that the memory-bound
     * layers after it find them there. Present when struct_size covers it
     * (kiln 0.1 after 2026-12-02). */
    int32_t (*upcoming_constants)(void *stream, int64_t budget, const void **ptr, int64_t *bytes, int32_t max);
} kiln_host_api;

/* Signature of the one symbol every plugin library exports. */
typedef kiln_status (*kiln_plugin_library_init_fn)(const kiln_host_api *host, kiln_registry *reg);

#ifdef __cplusplus
}
#endif

#endif
