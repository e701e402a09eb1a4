// Shared by the attention plugins' CUDA paths (header-only: each plugin is its own .so).
#ifndef CTRL_PLUGIN_ATTENTION_CUDA_COMMON_CUH
#define CTRL_PLUGIN_ATTENTION_CUDA_COMMON_CUH

#include <cuda_runtime.h>

#include <ctrl/plugin_api.h>

// The longest sequence of the batch (host-side cu_seqlens): the grid covers its tiles.
static inline int attention_max_len(const ctrl_attention_args *a) {
    int m = 0;
    for (int b = 0; b < a->n_seqs; b++) m = max(m, a->cu_seqlens_host[b + 1] - a->cu_seqlens_host[b]);
    return m;
}

// Gemma 2's logit soft-capping of a scaled score s (cap > 0: cap tanh(s / cap); else s itself);
// *grad gets d capped / d s = 1 - tanh^2 (1 without a cap), what the backward multiplies dS by.
__device__ __forceinline__ float attention_softcap(float s, float cap, float *grad) {
    if (!(cap > 0.f)) {
        *grad = 1.f;
        return s;
    }
    const float t = tanhf(s / cap);
    *grad = 1.f - t * t;
    return cap * t;
}

// CTRL_OK, or the last launch's error as "attention NAME (cuda) WHAT: ...".
static inline ctrl_status attention_launch_error(const char *name, const char *what) {
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) return CTRL_OK;
    return ctrl_error_set(CTRL_ERR_DEVICE, "attention %s (cuda) %s: %s", name, what, cudaGetErrorString(err));
}

#endif
