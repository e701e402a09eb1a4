/* Forward + backward tokens/s and peak RSS of a model directory on the CPU (the flash attention
 * plugin loaded from the plugin directory), on a packed batch of equal-length sequences of random
 * tokens: the ctrl side of bench/cpu/run.sh, which runs PyTorch on the same model and batch.
 * MEMORY names a memory strategy plugin to attach (e.g. checkpointing, with its defaults); none
 * by default; DTYPE fp32 (default) or bf16 (the linear projections in bf16, as `[train] dtype`).
 * Each step is what SFT runs: the forward with the head's backward fused in (dL/dlogp of the mean
 * loss is known up front), then the backward. Prints the activation bytes the model holds after
 * the forward and the peak RSS.
 * usage: bench_cpu_model MODEL_DIR PLUGIN_DIR SEQS SEQ_LEN STEPS [MEMORY] [DTYPE] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <ctrl/attention.h>
#include <ctrl/memory.h>

#include "config/config_load.h"
#include "model/model.h"
#include "registry/registry.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 6 || argc > 8) {
        fprintf(stderr, "usage: bench_cpu_model MODEL_DIR PLUGIN_DIR SEQS SEQ_LEN STEPS [MEMORY] [DTYPE]\n");
        return 2;
    }
    const int B = atoi(argv[3]), L = atoi(argv[4]), steps = atoi(argv[5]), T = B * L;
    ctrl_registry *reg;
    const char *dirs[] = {argv[2]};
    if (ctrl_registry_create(&reg) != CTRL_OK || ctrl_registry_load_standard(reg, dirs, 1) != CTRL_OK) {
        fprintf(stderr, "bench: %s\n", ctrl_error_message());
        return 1;
    }
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_ATTENTION, "flash");
    ctrl_model *m;
    if (!e || ctrl_model_load(argv[1], e->plugin->ops, &m) != CTRL_OK) {
        fprintf(stderr, "bench: %s\n", e ? ctrl_error_message() : "no flash plugin");
        return 1;
    }
    const char *memory = argc >= 7 ? argv[6] : "none", *dtype = argc == 8 ? argv[7] : "fp32";
    if (ctrl_model_set_compute_dtype(m, strcmp(dtype, "bf16") == 0 ? CTRL_BF16 : CTRL_F32) != CTRL_OK) {
        fprintf(stderr, "bench: %s\n", ctrl_error_message());
        return 1;
    }
    const ctrl_memory_ops *mops = NULL;
    ctrl_memory *mem = NULL;
    if (strcmp(memory, "none") != 0) {
        const ctrl_plugin_entry *me = ctrl_registry_find(reg, CTRL_KIND_MEMORY, memory);
        if (!me) {
            fprintf(stderr, "bench: no memory plugin '%s'\n", memory);
            return 1;
        }
        mops = me->plugin->ops;
        /* the plugin reads its validated options: a config selecting it with its defaults */
        char ini[] = "/tmp/bench_cpu_model_XXXXXX";
        const int fd = mkstemp(ini);
        FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
        ctrl_config *cfg = NULL;
        if (f) fprintf(f, "[model]\npath = %s\n[memory]\nstrategies = %s\n", argv[1], memory), fclose(f);
        ctrl_status st =
            f ? ctrl_config_load(ini, NULL, 0, reg, &cfg) : ctrl_error_set(CTRL_ERR_IO, "%s", ini);
        if (fd >= 0) unlink(ini);
        if (st == CTRL_OK) st = mops->create(ctrl_host_table(), cfg, ctrl_model_cfg(m)->n_layers, &mem);
        if (st == CTRL_OK) st = ctrl_model_set_memory(m, mops, mem);
        ctrl_config_free(cfg);
        if (st != CTRL_OK) {
            fprintf(stderr, "bench: %s\n", ctrl_error_message());
            return 1;
        }
    }
    int32_t *tok = malloc(4 * T), *pos = malloc(4 * T), *tg = malloc(4 * T), *cu = malloc(4 * (B + 1));
    float *logp = malloc(4 * T), *dlogp = malloc(4 * T);
    unsigned s = 12345;
    const int V = ctrl_model_cfg(m)->vocab_size;
    for (int t = 0; t < T; t++) {
        s = s * 1103515245u + 12345u;
        tok[t] = (int32_t)((s >> 8) % (unsigned)V);
        pos[t] = t % L;
    }
    for (int b = 0; b <= B; b++) cu[b] = b * L;
    for (int t = 0; t < T; t++) tg[t] = pos[t] == L - 1 ? -100 : tok[t + 1];
    const int n_tg = T - B;
    for (int t = 0; t < T; t++) dlogp[t] = tg[t] >= 0 ? -1.0f / n_tg : 0.0f;
    ctrl_batch batch = {.T = T, .B = B, .tokens = tok, .positions = pos, .cu_seqlens = cu, .targets = tg};
    double best = 1e30, total = 0;
    for (int i = -1; i < steps; i++) { /* one warm-up step */
        double t0 = now();
        if (ctrl_model_forward_fused(m, &batch, dlogp, logp, NULL, NULL) != CTRL_OK ||
            ctrl_model_backward(m, NULL) != CTRL_OK) {
            fprintf(stderr, "bench: %s\n", ctrl_error_message());
            return 1;
        }
        double dt = now() - t0;
        if (i >= 0) total += dt, best = dt < best ? dt : best;
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    size_t n_params;
    ctrl_model_params(m, &n_params);
    printf(
        "ctrl   params %.2fM tokens/step %d %s memory %s: %.0f tokens/s (mean of %d steps; best step %.0f), "
        "activations held %.0f MiB, peak RSS %.0f MiB\n",
        n_params / 1e6, T, dtype, memory, T * steps / total, steps, T / best,
        ctrl_model_activation_bytes(m) / 1048576.0, ru.ru_maxrss / 1024.0);
    ctrl_model_free(m);
    if (mem) mops->destroy(mem);
    ctrl_registry_destroy(reg);
    return 0;
}
