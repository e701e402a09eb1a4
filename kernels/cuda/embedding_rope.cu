// Token embedding (gather / deterministic scatter-add) and rotary embeddings (tables computed on
// the host by ctrl_cpu_rope_tables and uploaded once).
#include <cuda_runtime.h>

#include "cuda/cuda_ops.h"
#include "cuda/launch.h"
#include "device/cuda_check.h"

namespace {

__global__ void embedding_fwd(float *out, const int32_t *tokens, const float *wte, int T, int C) {
    int64_t n = (int64_t)T * C;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i / C, c = i % C;
        out[i] = wte[(int64_t)tokens[t] * C + c];
    }
}

// One thread per channel walks the tokens in order: repeated ids accumulate without atomics, and
// the result does not depend on scheduling.
__global__ void embedding_bwd(float *dwte, const float *dout, const int32_t *tokens, int T, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int t = 0; t < T; t++) // a negative id contributes nothing (nn.Embedding's padding_idx)
        if (tokens[t] >= 0) dwte[(int64_t)tokens[t] * C + c] += dout[(int64_t)t * C + c];
}

// sign = +1 rotates by the angle (forward), -1 by its negative (backward, the transpose).
__global__ void rope_kernel(float *out, const float *x, const int32_t *pos, const float *cos_tab, const float *sin_tab,
                            int T, int H, int D, float sign) {
    const int half = D / 2;
    int64_t n = (int64_t)T * H * half;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = i % half, th = i / half, t = th / H;
        float c = cos_tab[(int64_t)pos[t] * half + j], s = sign * sin_tab[(int64_t)pos[t] * half + j];
        const float *xi = x + th * D;
        float a = xi[j], b = xi[j + half];
        float *o = out + th * D;
        o[j] = a * c - b * s;
        o[j + half] = b * c + a * s;
    }
}

} // namespace

extern "C" ctrl_status ctrl_cuda_embedding_forward(float *out, const int32_t *tokens, const float *wte, int T, int C) {
    embedding_fwd<<<ctrl_grid_for((int64_t)T * C, 256), 256>>>(out, tokens, wte, T, C);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_embedding_backward(float *dwte, const float *dout, const int32_t *tokens, int T,
                                                    int C) {
    embedding_bwd<<<(C + 127) / 128, 128>>>(dwte, dout, tokens, T, C);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_rope_forward(float *out, const float *x, const int32_t *pos, const float *cos_tab,
                                              const float *sin_tab, int T, int n_head, int head_dim) {
    rope_kernel<<<ctrl_grid_for((int64_t)T * n_head * head_dim / 2, 256), 256>>>(out, x, pos, cos_tab, sin_tab, T,
                                                                                n_head, head_dim, 1.0f);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}

extern "C" ctrl_status ctrl_cuda_rope_backward(float *dx, const float *dout, const int32_t *pos, const float *cos_tab,
                                               const float *sin_tab, int T, int n_head, int head_dim) {
    rope_kernel<<<ctrl_grid_for((int64_t)T * n_head * head_dim / 2, 256), 256>>>(dx, dout, pos, cos_tab, sin_tab, T,
                                                                                n_head, head_dim, -1.0f);
    CTRL_CUDA_CHECK_LAUNCH();
    return CTRL_OK;
}
