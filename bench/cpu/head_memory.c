/* The fused head's memory against materialised logits on the CPU: forward + backward of
 * sum(logp * g) for T tokens, C = 896 (Qwen2.5-0.5B), V = 32000 or 151936. Each variant runs in
 * its own child process so its peak RSS (getrusage of the child) is its own. "fused chunks": the
 * chunked forward, then the backward recomputing each chunk's logits; "fused one pass": the
 * forward with the backward inside (dL/dlogp known up front, what SFT runs); "materialised": the
 * [T, V] logits with one sgemm, a log-softmax and its gradient, as PyTorch does without a fused
 * kernel.  usage: bench_head_memory [T] */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

#include "cpu/cpu_ops.h"

static float *rnd(size_t n, float scale) {
    float *x = malloc(n * 4);
    unsigned s = 12345;
    for (size_t i = 0; i < n; i++)
        s = s * 1103515245u + 12345u, x[i] = ((s >> 9) / 8388608.0f - 0.5f) * scale;
    return x;
}

enum { MATERIALISED, CHUNKS, ONE_PASS };

static void run(int variant, int T, int C, int V) {
    float *h = rnd((size_t)T * C, 2), *w = rnd((size_t)V * C, 0.1f), *g = rnd(T, 1);
    float *dh = malloc(sizeof(float) * T * C), *dw = calloc((size_t)V * C, 4), *logp = malloc(4 * T),
          *lse = malloc(4 * T);
    int32_t *tg = malloc(4 * T);
    for (int t = 0; t < T; t++) tg[t] = (t * 7919) % V;
    ctrl_head_args a = {.hidden = h, .w = w, .targets = tg, .T = T, .C = C, .V = V, .temperature = 1};
    if (variant == CHUNKS) {
        void *ws = malloc(ctrl_cpu_head_workspace_bytes(&a));
        ctrl_cpu_head_forward(&a, logp, NULL, lse, NULL, ws);
        ctrl_cpu_head_backward(&a, lse, g, NULL, NULL, dh, dw, ws);
    } else if (variant == ONE_PASS) {
        void *ws = malloc(ctrl_cpu_head_fused_workspace_bytes(&a));
        ctrl_cpu_head_forward_backward(&a, g, logp, NULL, lse, NULL, dh, dw, ws);
    } else {
        float *z = malloc(sizeof(float) * (size_t)T * V);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, V, C, 1, h, C, w, C, 0, z, V);
        for (int t = 0; t < T; t++) { /* log-softmax, then its gradient in place */
            float *r = z + (size_t)t * V, m = -INFINITY;
            for (int j = 0; j < V; j++) m = fmaxf(m, r[j]);
            double s = 0;
            for (int j = 0; j < V; j++) s += exp(r[j] - m);
            float l = m + (float)log(s);
            logp[t] = r[tg[t]] - l;
            for (int j = 0; j < V; j++) r[j] = -g[t] * expf(r[j] - l);
            r[tg[t]] += g[t];
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, C, V, 1, z, V, w, C, 0, dh, C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, T, 1, z, V, h, C, 1, dw, C);
        free(z);
    }
    printf("%.6f\n", logp[0]); /* keeps the work observable */
}

int main(int argc, char **argv) {
    const int T = argc > 1 ? atoi(argv[1]) : 2048, C = 896, Vs[2] = {32000, 151936};
    printf("T=%d C=%d: forward+backward of the LM head on the CPU, each variant in its own process\n", T, C);
    printf("%-8s %-15s %10s %14s %10s\n", "V", "variant", "time s", "peak RSS MiB", "logits MiB");
    for (int v = 0; v < 2; v++)
        for (int variant = ONE_PASS; variant >= MATERIALISED; variant--) {
            struct timespec a, b;
            clock_gettime(CLOCK_MONOTONIC, &a);
            pid_t pid = fork();
            if (pid == 0) {
                int null = open("/dev/null", 1);
                dup2(null, 1);
                run(variant, T, C, Vs[v]);
                _exit(0);
            }
            int status;
            struct rusage ru;
            wait4(pid, &status, 0, &ru);
            clock_gettime(CLOCK_MONOTONIC, &b);
            static const char *const names[] = {"materialised", "fused chunks", "fused one pass"};
            printf("%-8d %-15s %10.2f %14.0f %10.0f\n", Vs[v], names[variant],
                   (b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) * 1e-9, ru.ru_maxrss / 1024.0,
                   (double)T * Vs[v] * 4 / 1048576.0);
        }
    return 0;
}
