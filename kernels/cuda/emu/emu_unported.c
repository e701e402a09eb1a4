/* The CUDA ops whose sources the emulator does not compile yet (gemm.cu: cuBLASLt; head.cu): they
 * say so instead of running, so a test that reaches them fails naming what is missing. */
#include "cuda/cuda_ops.h"

#define UNPORTED(what)                                                                                       \
    ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s is not emulated yet (kernels/cuda/emu/README.md)", what)

void ctrl_cuda_linear_release(void) {}

ctrl_status ctrl_cuda_gemm_f32(int trans_a, int trans_b, int M, int N, int K, float alpha, const float *A,
                               int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B,
        (void)ldb;
    (void)beta, (void)C, (void)ldc;
    return UNPORTED("ctrl_cuda_gemm_f32");
}
ctrl_status ctrl_cuda_linear_forward_f32(float *out, const float *x, const float *w, const float *bias, int T,
                                         int IN, int OUT) {
    (void)out, (void)x, (void)w, (void)bias, (void)T, (void)IN, (void)OUT;
    return UNPORTED("ctrl_cuda_linear_forward_f32");
}
ctrl_status ctrl_cuda_linear_forward_bf16(uint16_t *out, const uint16_t *x, const uint16_t *w, int T, int IN,
                                          int OUT) {
    (void)out, (void)x, (void)w, (void)T, (void)IN, (void)OUT;
    return UNPORTED("ctrl_cuda_linear_forward_bf16");
}
ctrl_status ctrl_cuda_linear_backward_f32(float *dx, float *dw, float *dbias, const float *dout,
                                          const float *x, const float *w, int T, int IN, int OUT) {
    (void)dx, (void)dw, (void)dbias, (void)dout, (void)x, (void)w, (void)T, (void)IN, (void)OUT;
    return UNPORTED("ctrl_cuda_linear_backward_f32");
}
size_t ctrl_cuda_head_workspace_bytes(const struct ctrl_head_args *a) {
    (void)a;
    return 0;
}
ctrl_status ctrl_cuda_head_forward(const struct ctrl_head_args *a, float *logp, float *entropy, float *lse,
                                   int32_t *correct, void *workspace) {
    (void)a, (void)logp, (void)entropy, (void)lse, (void)correct, (void)workspace;
    return UNPORTED("ctrl_cuda_head_forward");
}
ctrl_status ctrl_cuda_head_backward(const struct ctrl_head_args *a, const float *lse, const float *dlogp,
                                    const float *entropy, const float *dentropy, float *dhidden, float *dw,
                                    void *workspace) {
    (void)a, (void)lse, (void)dlogp, (void)entropy, (void)dentropy, (void)dhidden, (void)dw, (void)workspace;
    return UNPORTED("ctrl_cuda_head_backward");
}
