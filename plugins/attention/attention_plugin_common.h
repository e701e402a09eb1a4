/* Shared by the attention plugins' descriptors (header-only: each plugin is its own .so). */
#ifndef CTRL_PLUGIN_ATTENTION_COMMON_H
#define CTRL_PLUGIN_ATTENTION_COMMON_H

#include <math.h>

#include <ctrl/plugin_api.h>

/* What the CPU paths run: fp32 on the CPU, whole GQA groups, host-side cu_seqlens. */
static inline int attention_cpu_f32_supported(const ctrl_attention_args *a) {
    return a->device.type == CTRL_DEVICE_CPU && a->dtype == CTRL_F32 && a->n_kv_head > 0 && a->n_head > 0 &&
           a->n_head % a->n_kv_head == 0 && a->cu_seqlens_host != NULL && a->head_dim > 0;
}

/* The same on a CUDA device (the plugin built with its CUDA sources). */
static inline int attention_cuda_f32_supported(const ctrl_attention_args *a) {
#ifdef CTRL_HAVE_CUDA
    return a->device.type == CTRL_DEVICE_CUDA && a->dtype == CTRL_F32 && a->n_kv_head > 0 && a->n_head > 0 &&
           a->n_head % a->n_kv_head == 0 && a->cu_seqlens_host != NULL && a->cu_seqlens != NULL &&
           a->head_dim > 0;
#else
    (void)a;
    return 0;
#endif
}

/* CTRL_OK, or the error saying why `name` cannot run these arguments (`supported` says what it
 * runs; and, for backward, that the saved and gradient buffers are there). softcap_on_device: the
 * plugin's device path honours logit soft-capping too (else it runs on the CPU only). */
static inline ctrl_status attention_check_args_softcap(const char *name, const ctrl_attention_args *a,
                                                       int backward,
                                                       int (*supported)(const ctrl_attention_args *),
                                                       int softcap_on_device) {
    if (a->size < sizeof(ctrl_attention_args))
        return ctrl_error_set(CTRL_ERR_RUNTIME, "attention %s: argument struct of size %zu is too old", name,
                              a->size);
    if (!supported(a))
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "attention %s: cannot run %s on %s with %d/%d heads of dimension %d (fp32 on the "
            "CPU; on CUDA as the plugin's CUDA path allows; n_head %% n_kv_head == 0)",
            name, ctrl_dtype_name(a->dtype), a->device.type == CTRL_DEVICE_CPU ? "cpu" : "cuda", a->n_head,
            a->n_kv_head, a->head_dim);
    if (!(a->softcap >= 0))
        return ctrl_error_set(CTRL_ERR_RUNTIME, "attention %s: softcap = %g must be >= 0", name,
                              (double)a->softcap);
    if (a->softcap > 0 && a->device.type != CTRL_DEVICE_CPU && !softcap_on_device)
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "attention %s: logit soft-capping (softcap = %g, Gemma 2) runs on the CPU only so far", name,
            (double)a->softcap);
    if (backward && (!a->lse || !a->dout || !a->dq || !a->dk || !a->dv))
        return ctrl_error_set(CTRL_ERR_RUNTIME, "attention %s: backward needs lse, dout, dq, dk and dv",
                              name);
    return CTRL_OK;
}

static inline ctrl_status attention_check_args(const char *name, const ctrl_attention_args *a, int backward,
                                               int (*supported)(const ctrl_attention_args *)) {
    return attention_check_args_softcap(name, a, backward, supported, 0);
}

/* Soft-capping of a scaled score (cap > 0): cap tanh(s / cap); and the factor its backward takes,
 * d capped / d s = 1 - tanh^2, from the capped value c. */
static inline float attention_softcap(float s, float cap) { return cap * tanhf(s / cap); }
static inline float attention_softcap_grad(float c, float cap) { return 1.0f - (c / cap) * (c / cap); }

/* The backward contribution of one (query i, key j) pair with probability p = exp(s_ij - lse_i),
 * where Di = dO_i . O_i:  dv_j += p dO_i;  ds = p (dO_i . v_j - Di) scale;  dq_i += ds k_j;
 * dk_j += ds q_i. */
static inline void attention_backward_pair(float p, float Di, float scale, const float *dout_i,
                                           const float *q_i, const float *k_j, const float *v_j, float *dq_i,
                                           float *dk_j, float *dv_j, int D) {
    float dp = 0;
#pragma omp simd reduction(+ : dp)
    for (int d = 0; d < D; d++) {
        dv_j[d] += p * dout_i[d];
        dp += dout_i[d] * v_j[d];
    }
    const float ds = p * (dp - Di) * scale;
#pragma omp simd
    for (int d = 0; d < D; d++) {
        dq_i[d] += ds * k_j[d];
        dk_j[d] += ds * q_i[d];
    }
}

#endif
