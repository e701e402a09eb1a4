/* Element types and devices of the buffers the core hands to plugins (attention arguments,
 * optimizer devices). Buffers are plain pointers with their shapes given beside them. */
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

/* The most dimensions a tensor the core reads may have (safetensors shapes). */
#define CTRL_MAX_DIMS 4

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

#ifdef __cplusplus
}
#endif
#endif
