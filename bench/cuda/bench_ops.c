/* Memory-bound CUDA ops on a Qwen2.5-0.5B-shaped step (T = 8192 tokens, C = 896, intermediate 4864,
 * 14 heads of 64), fp32, and AdamW over 494M parameters: time per call (median of 7 timings of 20
 * calls, host clock after a device synchronize) and achieved bandwidth for the fewest bytes each op
 * must move. Compare with bench/cuda/torch_ops.py and the copy bandwidth of bench_cuda_ceilings.
 * usage: bench_cuda_ops */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu/cpu_ops.h"
#include "bench_common.h"
#include "cuda/cuda_ops.h"

typedef enum { RMS_FWD, RMS_BWD, SWI_FWD, SWI_BWD, ROPE_FWD, ADAMW } op_id;

typedef struct {
    int T, C, I, H, D;
    int64_t P;
    float *x, *w, *out, *rstd, *dout, *dx, *dw, *g, *u, *o2, *dg, *du, *q, *q2, *ct, *st, *p, *pg, *m, *v;
    uint16_t *p16;
    int32_t *pos;
} bufs;

static void run(op_id op, bufs *b, int step) {
    switch (op) {
    case RMS_FWD:
        BENCH_CHECK(ctrl_cuda_rmsnorm_forward(b->out, b->rstd, b->x, b->w, b->T, b->C, 1e-6f));
        break;
    case RMS_BWD:
        BENCH_CHECK(ctrl_cuda_rmsnorm_backward(b->dx, b->dw, b->dout, b->x, b->w, b->rstd, b->T, b->C));
        break;
    case SWI_FWD: BENCH_CHECK(ctrl_cuda_swiglu_forward(b->o2, b->g, b->u, (int64_t)b->T * b->I)); break;
    case SWI_BWD:
        BENCH_CHECK(ctrl_cuda_swiglu_backward(b->dg, b->du, b->o2, b->g, b->u, (int64_t)b->T * b->I));
        break;
    case ROPE_FWD:
        BENCH_CHECK(ctrl_cuda_rope_forward(b->q2, b->q, b->pos, b->ct, b->st, b->T, b->H, b->D));
        break;
    case ADAMW:
        BENCH_CHECK(ctrl_cuda_adamw_step(b->p, b->pg, b->m, b->v, b->p16, b->P, 1e-5f, 0.9f, 0.999f, 1e-8f,
                                         0.01f, step));
        break;
    }
}

int main(void) {
    if (ctrl_cuda_device_count() == 0) {
        printf("bench_cuda_ops: skipped: %s\n", ctrl_cuda_unavailable_reason());
        return 0;
    }
    bufs b = {.T = 8192, .C = 896, .I = 4864, .H = 14, .D = 64, .P = 494032768};
    size_t tc = (size_t)b.T * b.C, ti = (size_t)b.T * b.I, tq = (size_t)b.T * b.H * b.D;
    b.x = bench_dev_random(tc, 1.0f), b.w = bench_dev_random(b.C, 1.0f), b.out = bench_dev_random(tc, 1.0f),
    b.rstd = bench_dev_random(b.T, 1.0f);
    b.dout = bench_dev_random(tc, 1.0f), b.dx = bench_dev_random(tc, 1.0f),
    b.dw = bench_dev_random(b.C, 1.0f);
    b.g = bench_dev_random(ti, 1.0f), b.u = bench_dev_random(ti, 1.0f), b.o2 = bench_dev_random(ti, 1.0f),
    b.dg = bench_dev_random(ti, 1.0f), b.du = bench_dev_random(ti, 1.0f);
    b.q = bench_dev_random(tq, 1.0f), b.q2 = bench_dev_random(tq, 1.0f);
    const int max_pos = 2048;
    float *ct = malloc((size_t)max_pos * 32 * 4), *st = malloc((size_t)max_pos * 32 * 4);
    ctrl_rope_params rp = {.kind = CTRL_ROPE_DEFAULT, .theta = 1e6, .factor = 1, .partial_rotary_factor = 1};
    ctrl_cpu_rope_tables(ct, st, max_pos, b.D, &rp);
    BENCH_CHECK(ctrl_cuda_malloc((void **)&b.ct, (size_t)max_pos * 32 * 4));
    BENCH_CHECK(ctrl_cuda_malloc((void **)&b.st, (size_t)max_pos * 32 * 4));
    BENCH_CHECK(ctrl_cuda_memcpy_h2d(b.ct, ct, (size_t)max_pos * 32 * 4));
    BENCH_CHECK(ctrl_cuda_memcpy_h2d(b.st, st, (size_t)max_pos * 32 * 4));
    int32_t *pos = malloc(b.T * 4);
    for (int t = 0; t < b.T; t++) pos[t] = t % max_pos; /* four packed sequences of 2048 */
    BENCH_CHECK(ctrl_cuda_malloc((void **)&b.pos, b.T * 4));
    BENCH_CHECK(ctrl_cuda_memcpy_h2d(b.pos, pos, b.T * 4));
    b.p = bench_dev_random((size_t)b.P, 1.0f), b.pg = bench_dev_random(b.P, 1.0f),
    b.m = bench_dev_random(b.P, 1.0f), b.v = bench_dev_random(b.P, 1.0f);
    BENCH_CHECK(ctrl_cuda_malloc((void **)&b.p16, b.P * 2));
    BENCH_CHECK(ctrl_cuda_memset(b.v, 0, b.P * 4));

    static const struct {
        op_id op;
        const char *name;
    } ops[] = {{RMS_FWD, "rmsnorm_fwd"}, {RMS_BWD, "rmsnorm_bwd"}, {SWI_FWD, "swiglu_fwd"},
               {SWI_BWD, "swiglu_bwd"},  {ROPE_FWD, "rope_fwd"},   {ADAMW, "adamw_494M"}};
    /* The fewest bytes each op must move. */
    const double bytes[] = {2.0 * tc * 4, 3.0 * tc * 4, 3.0 * ti * 4, 5.0 * ti * 4, 2.0 * tq * 4, 30.0 * b.P};
    for (int k = 0; k < 6; k++) {
        const int inner = ops[k].op == ADAMW ? 3 : 20;
        double times[7];
        int step = 1;
        for (int i = 0; i < 3; i++) run(ops[k].op, &b, step++);
        for (int r = 0; r < 7; r++) {
            BENCH_CHECK(ctrl_cuda_synchronize());
            double t0 = bench_now();
            for (int i = 0; i < inner; i++) run(ops[k].op, &b, step++);
            BENCH_CHECK(ctrl_cuda_synchronize());
            times[r] = (bench_now() - t0) / inner;
        }
        const double median = bench_median(times, 7);
        printf("ctrl   %-12s %8.3f ms  %6.0f GB/s\n", ops[k].name, median * 1e3, bytes[k] / median / 1e9);
    }
    return 0;
}
