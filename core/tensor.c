/* dtype helpers shared by every backend. */
#include <ctrl/tensor.h>

size_t ctrl_dtype_size(ctrl_dtype dtype) {
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

const char *ctrl_dtype_name(ctrl_dtype dtype) {
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
