/* ctrl's CUDA emulator: bf16 storage type and the conversions the kernels use (round to nearest
 * even, NaN kept quiet), as on the device. */
#ifndef CTRL_EMU_CUDA_BF16_H
#define CTRL_EMU_CUDA_BF16_H

#include <stdint.h>
#include <string.h>

struct __nv_bfloat16 {
    uint16_t bits;
};

static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.bits = 0x7fff; /* the canonical NaN, as the device writes */
        return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    r.bits = (uint16_t)(u >> 16);
    return r;
}

static inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }

static inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.bits << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#endif
