/* Tensors: a dtype, a device, up to 4 dims and a data pointer. Buffers are owned elsewhere
 * (arenas, flat per-layer buffers); a ctrl_tensor is a view. */
#ifndef CTRL_TENSOR_H
#define CTRL_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ctrl_dtype {
    CTRL_F32 = 0,
    CTRL_BF16,
    CTRL_F16,
    CTRL_I32,
    CTRL_I64,
    CTRL_U8,
    CTRL_DTYPE_COUNT,
} ctrl_dtype;

typedef enum ctrl_device_type {
    CTRL_DEVICE_CPU = 0,
    CTRL_DEVICE_CUDA,
} ctrl_device_type;

typedef struct ctrl_device {
    ctrl_device_type type;
    int index; /* cuda:N; 0 for the CPU */
} ctrl_device;

#define CTRL_MAX_DIMS 4

typedef struct ctrl_tensor {
    void *data;
    ctrl_dtype dtype;
    ctrl_device device;
    int ndim;
    int64_t shape[CTRL_MAX_DIMS];
    int64_t stride[CTRL_MAX_DIMS]; /* in elements */
} ctrl_tensor;

/* Header-only, so that plugins can use them without linking against libctrl. */
static inline size_t ctrl_dtype_size(ctrl_dtype dtype) {
    switch (dtype) {
    case CTRL_F32: return 4;
    case CTRL_BF16: return 2;
    case CTRL_F16: return 2;
    case CTRL_I32: return 4;
    case CTRL_I64: return 8;
    case CTRL_U8: return 1;
    default: return 0;
    }
}

static inline const char *ctrl_dtype_name(ctrl_dtype dtype) {
    switch (dtype) {
    case CTRL_F32: return "f32";
    case CTRL_BF16: return "bf16";
    case CTRL_F16: return "f16";
    case CTRL_I32: return "i32";
    case CTRL_I64: return "i64";
    case CTRL_U8: return "u8";
    default: return "?";
    }
}

/* Number of elements (product of the shape). */
static inline int64_t ctrl_tensor_numel(const ctrl_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

#ifdef __cplusplus
}
#endif
#endif
