// Launch-shape helpers shared by the elementwise kernels.
#ifndef CTRL_KERNELS_CUDA_LAUNCH_H
#define CTRL_KERNELS_CUDA_LAUNCH_H

#include <stdint.h>

// Grid-stride loops: enough blocks to fill the GPU, never more than needed.
static inline int ctrl_grid_for(int64_t n, int threads) {
    int64_t blocks = (n + threads - 1) / threads;
    if (blocks < 1) blocks = 1;
    if (blocks > 132 * 32) blocks = 132 * 32;
    return (int)blocks;
}

#endif
