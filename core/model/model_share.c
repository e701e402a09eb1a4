/* Operands that several of a layer's bf16 products read, packed once for all of them (see
 * model_internal.h, model_share; kernels/cpu/gemm_bf16.c: ctrl_cpu_gemm_bf16_share). The forward's
 * ln1 (q, k and v and their adapters' A), ln2 (gate and up, theirs), att and h (o and down with their
 * adapters); the backward's dL/dout of a projection with an adapter (the base's dX and the adapter's
 * dY B), and ln1 / ln2 as the B of the weight gradients (q, k, v; gate, up: dW = dY^T x, or the
 * adapters' dA). Only on the CPU's blocked bf16 GEMM; the products are bit for bit those that pack
 * per call; CTRL_NO_SHARED_OPERANDS=1 turns it off (for comparisons). */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_ops.h"
#include "model/model_internal.h"

static int share_on(const ctrl_model *m) {
    if (!m->linear_bf16 || !m->be->host_memory || ctrl_cpu_bf16_kind_now() == CTRL_CPU_BF16_FP32) return 0;
    const char *v = getenv("CTRL_NO_SHARED_OPERANDS");
    return !(v && *v && strcmp(v, "0") != 0);
}

void model_share(const ctrl_model *m, int slot, int as_b, const float *x, int T, int IN, int readers) {
    if (!x || readers < 2 || !share_on(m)) {
        ctrl_cpu_gemm_bf16_share(slot, 0, 0, 0, 0, NULL, 0);
        return;
    }
    if (as_b) /* x [T, IN] as the B of dW = dY^T x: op(B)[K = T, N = IN] */
        ctrl_cpu_gemm_bf16_share(slot, 1, 0, IN, T, x, IN);
    else /* x [T, IN] as the A of x W^T (or dY as the A of dY W) */
        ctrl_cpu_gemm_bf16_share(slot, 0, 0, T, IN, x, IN);
}

void model_share_end(const ctrl_model *m) {
    (void)m;
    ctrl_cpu_gemm_bf16_share(0, 0, 0, 0, 0, NULL, 0);
    ctrl_cpu_gemm_bf16_share(1, 0, 0, 0, 0, NULL, 0);
}

void model_share_release(const ctrl_model *m) {
    (void)m;
    ctrl_cpu_gemm_bf16_share_release();
}
