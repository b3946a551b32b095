/* kiln/network.h — defining a network: inputs, profiles, layers, outputs.
 *
 * A network is a DAG of layers over tensors. Every add_* call infers the
 * output shape symbolically (dims are expressions of the dynamic input dims)
 * and fails at once, naming the layer, when shapes cannot agree. The builder
 * later checks every shape at each profile's min, opt and max.
 *
 * A network is used by one thread at a time. Tensor handles stay valid until
 * the network is destroyed.
 */
#ifndef KILN_NETWORK_H
#define KILN_NETWORK_H

#include <kiln/plugin.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kiln_network kiln_network;

/* Handle of a tensor inside one network. id < 0 is invalid. A
 * fixed-layout value type: it never grows. */
typedef struct kiln_tensor {
    int32_t id;
} kiln_tensor;

typedef enum kiln_binary_op {
    KILN_BINARY_ADD = 0,
    KILN_BINARY_SUB,
    KILN_BINARY_MUL,
    KILN_BINARY_DIV,
    KILN_BINARY_POW,
    KILN_BINARY_MAX,
    KILN_BINARY_MIN,
    KILN_BINARY_OP_COUNT
} kiln_binary_op;

typedef enum kiln_unary_op {
    KILN_UNARY_NEG = 0,
    KILN_UNARY_ABS,
    KILN_UNARY_EXP,
    KILN_UNARY_LOG,
    KILN_UNARY_SQRT,
    KILN_UNARY_RSQRT,
    KILN_UNARY_TANH,
    KILN_UNARY_SIGMOID,
    KILN_UNARY_RELU,
    KILN_UNARY_GELU_ERF,
    KILN_UNARY_GELU_TANH,
    KILN_UNARY_SILU,
    KILN_UNARY_OP_COUNT
} kiln_unary_op;

typedef enum kiln_reduce_op {
    KILN_REDUCE_SUM = 0,
    KILN_REDUCE_MEAN,
    KILN_REDUCE_MAX,
    KILN_REDUCE_MIN,
    KILN_REDUCE_OP_COUNT
} kiln_reduce_op;

/* Lower-case names ("add", "gelu_erf", "mean") and their parsers, used by
 * the network JSON format and `kiln inspect`. Parsers return
 * KILN_ERROR_INVALID_ARGUMENT for an unknown name. */
KILN_API const char *kiln_binary_op_name(kiln_binary_op op);
KILN_API const char *kiln_unary_op_name(kiln_unary_op op);
KILN_API const char *kiln_reduce_op_name(kiln_reduce_op op);
KILN_API kiln_status kiln_binary_op_parse(const char *name, kiln_binary_op *out);
KILN_API kiln_status kiln_unary_op_parse(const char *name, kiln_unary_op *out);
KILN_API kiln_status kiln_reduce_op_parse(const char *name, kiln_reduce_op *out);

/* ---- lifetime ------------------------------------------------------------ */

/* Creates an empty network. `reg` is borrowed for the network's lifetime and
 * resolves plugin layers; it may be NULL for a network without plugins. */
KILN_API kiln_status kiln_network_create(kiln_registry *reg, kiln_network **out);

/* NULL is a no-op. */
KILN_API void kiln_network_destroy(kiln_network *net);

/* ---- inputs and profiles -------------------------------------------------- */

/* Adds an input. dims->d[i] == -1 marks a dynamic dim, which every profile
 * must bound. `name` is copied and must be unique among tensor names. */
KILN_API kiln_status kiln_network_add_input(kiln_network *net, const char *name, kiln_dtype dtype,
                                            const kiln_dims *dims, kiln_tensor *out);

/* Appends an optimization profile; *index receives its number (0, 1, ...). */
KILN_API kiln_status kiln_network_add_profile(kiln_network *net, int32_t *index);

/* Sets the min/opt/max shapes of one input in one profile. Ranks must match
 * the input; static dims must equal the input's; min <= opt <= max, min >= 0.
 * Errors name the input, the profile and the offending dim. */
KILN_API kiln_status kiln_network_set_profile_shape(kiln_network *net, int32_t profile, const char *input,
                                                    const kiln_dims *min, const kiln_dims *opt, const kiln_dims *max);

/* ---- layers --------------------------------------------------------------
 * Every layer takes a `name` (copied; NULL picks "<op>_<n>"), which is used
 * in errors, `kiln inspect` and profiles. Its single output tensor is named
 * like the layer (multi-output plugins: "<layer>:<i>"). Layer and tensor
 * names are unique. */

/* A constant of static shape; `data` (dims product × dtype size bytes) is
 * copied. */
KILN_API kiln_status kiln_network_add_constant(kiln_network *net, const char *name, kiln_dtype dtype,
                                               const kiln_dims *dims, const void *data, kiln_tensor *out);

/* C = op(A) · op(B) over the last two axes; leading (batch) axes broadcast
 * numpy-style. A rank-1 operand is treated as a row (A) or column (B) vector
 * and that axis is dropped from the output. Float dtypes; A and B equal. */
KILN_API kiln_status kiln_network_add_matmul(kiln_network *net, const char *name, kiln_tensor a, int32_t transpose_a,
                                             kiln_tensor b, int32_t transpose_b, kiln_tensor *out);

/* Elementwise binary with numpy broadcasting; dtypes must be equal. */
KILN_API kiln_status kiln_network_add_binary(kiln_network *net, const char *name, kiln_binary_op op, kiln_tensor a,
                                             kiln_tensor b, kiln_tensor *out);

/* Elementwise unary on float tensors. */
KILN_API kiln_status kiln_network_add_unary(kiln_network *net, const char *name, kiln_unary_op op, kiln_tensor x,
                                            kiln_tensor *out);

/* Reduces over the axes whose bit is set in axes_mask (bit i = axis i). */
KILN_API kiln_status kiln_network_add_reduce(kiln_network *net, const char *name, kiln_reduce_op op, kiln_tensor x,
                                             uint32_t axes_mask, int32_t keep_dims, kiln_tensor *out);

/* Softmax along `axis` (negative counts from the end). */
KILN_API kiln_status kiln_network_add_softmax(kiln_network *net, const char *name, kiln_tensor x, int32_t axis,
                                              kiln_tensor *out);

/* Concatenates n >= 1 tensors of equal dtype and rank along `axis`. */
KILN_API kiln_status kiln_network_add_concat(kiln_network *net, const char *name, const kiln_tensor *inputs, int32_t n,
                                             int32_t axis, kiln_tensor *out);

/* Strided slice, one entry per axis. start >= 0; stride >= 1; size is the
 * number of elements taken, or -1 for "as many as fit to the end":
 * ceil((dim - start) / stride). */
KILN_API kiln_status kiln_network_add_slice(kiln_network *net, const char *name, kiln_tensor x, const int64_t *start,
                                            const int64_t *size, const int64_t *stride, kiln_tensor *out);

/* Shuffle = optional transpose, optional reshape, optional transpose, as in
 * TensorRT. In `reshape` a 0 copies the input dim at that index and one -1
 * is inferred from the element count. perm[i] names the input axis that
 * becomes output axis i. */
typedef struct kiln_shuffle_desc {
    uint32_t struct_size;
    uint32_t abi_version;
    int32_t has_first_transpose;
    int32_t first_transpose[KILN_MAX_RANK];
    int32_t has_reshape;
    kiln_dims reshape;
    int32_t has_second_transpose;
    int32_t second_transpose[KILN_MAX_RANK];
    int32_t reserved;
} kiln_shuffle_desc;

/* No transpose, no reshape: the identity. */
KILN_API void kiln_shuffle_desc_init(kiln_shuffle_desc *desc);

KILN_API kiln_status kiln_network_add_shuffle(kiln_network *net, const char *name, kiln_tensor x,
                                              const kiln_shuffle_desc *desc, kiln_tensor *out);

/* out = data indexed by `indices` (i32 or i64) along `axis`: shape
 * data[:axis] + indices + data[axis+1:]. An index out of range fails at
 * run time with KILN_ERROR_INVALID_ARGUMENT naming the layer. */
KILN_API kiln_status kiln_network_add_gather(kiln_network *net, const char *name, kiln_tensor data, kiln_tensor indices,
                                             int32_t axis, kiln_tensor *out);

/* Converts to `dtype` (float rounding: nearest even; float to int: toward
 * zero, saturating). */
KILN_API kiln_status kiln_network_add_cast(kiln_network *net, const char *name, kiln_tensor x, kiln_dtype dtype,
                                           kiln_tensor *out);

/* A plugin layer created from the registry's creator for the exact triple.
 * Fields are validated against the creator's schema (errors name the layer,
 * the plugin and the field). Up to max_outputs handles go to outputs;
 * *n_outputs receives the plugin's output count. */
KILN_API kiln_status kiln_network_add_plugin(kiln_network *net, const char *name, const char *plugin_name,
                                             const char *version, const char *plugin_namespace,
                                             const kiln_field *fields, int32_t n_fields, const kiln_tensor *inputs,
                                             int32_t n_inputs, kiln_tensor *outputs, int32_t max_outputs,
                                             int32_t *n_outputs);

/* Marks a tensor as a network output; `name` (may be NULL) renames it. */
KILN_API kiln_status kiln_network_mark_output(kiln_network *net, kiln_tensor t, const char *name);

/* ---- queries ------------------------------------------------------------- */

/* Finds a tensor by name. KILN_ERROR_NOT_FOUND when absent. */
KILN_API kiln_status kiln_network_find_tensor(const kiln_network *net, const char *name, kiln_tensor *out);

/* dtype and rank of a tensor. */
KILN_API kiln_status kiln_network_tensor_info(const kiln_network *net, kiln_tensor t, kiln_dtype *dtype, int32_t *rank);

KILN_API int32_t kiln_network_num_layers(const kiln_network *net);

/* ---- the network JSON format (docs/network-format.md) --------------------- */

/* Loads a network from a JSON file. Weight side files (.npy, .safetensors)
 * are resolved relative to the JSON file's folder. Errors name the layer and
 * the field ("layer \"fc1\": field \"transpose_b\": expected a boolean"). */
KILN_API kiln_status kiln_network_load_json(kiln_registry *reg, const char *path, kiln_network **out);

/* Same, from memory; `base_dir` resolves side files (may be NULL: none
 * allowed). */
KILN_API kiln_status kiln_network_parse_json(kiln_registry *reg, const char *text, size_t size, const char *base_dir,
                                             kiln_network **out);

#ifdef __cplusplus
}
#endif

#endif
