/* The run's memory report (see memory_report.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/log.h>

#include "train/memory_report.h"

void train_memory_read(double *rss_kb, double *peak_kb) {
    *rss_kb = *peak_kb = 0;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    while (f && fgets(line, sizeof line, f)) {
        if (!strncmp(line, "VmRSS:", 6)) *rss_kb = atof(line + 6);
        if (!strncmp(line, "VmHWM:", 6)) *peak_kb = atof(line + 6);
    }
    if (f) fclose(f);
}

void train_memory_mark(train_memory *t) {
    if (t->marks >= 3) return;
    train_memory_read(&t->rss_kb[t->marks], &t->peak_kb[t->marks]);
    t->marks++;
}

static double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

void train_memory_log(const train_memory *t, ctrl_model *m, const char *optimizer, const size_t sliced[2]) {
    if (t->marks < 3 || t->rss_kb[0] <= 0) return; /* no /proc here */
    size_t n_params = 0, n_grads = 0;
    (void)ctrl_model_params(m, &n_params), (void)ctrl_model_grads(m, &n_grads);
    /* the parameters as held (a LoRA base in bf16 panels or 2 bytes), decoding's bf16 panels beside */
    const double kb = 1024.0, params = mib(sliced ? (double)sliced[0] : (double)ctrl_model_param_bytes(m)),
                 panels = mib((double)ctrl_model_decode_panel_bytes(m)),
                 grads = mib(sliced ? (double)sliced[1] : sizeof(float) * (double)n_grads),
                 acts = mib((double)ctrl_model_activation_bytes(m)),
                 scratch = mib((double)ctrl_model_scratch_bytes(m)),
                 copy = mib((double)ctrl_model_bf16_copy_bytes(m));
    double opt = (t->rss_kb[2] - t->rss_kb[1]) / kb;
    if (opt < 0) opt = 0;
    const double rest = t->rss_kb[2] / kb - (params + grads + opt + acts + scratch + copy + panels);
    CTRL_INFO(
        "memory after the first step: peak %.0f MiB resident (VmHWM; %.0f MiB before the step, %.0f MiB "
        "after its forward/backward, %.0f MiB after the optimizer). Resident now %.0f MiB: parameters "
        "%.0f MiB, gradients %.0f MiB%s, %s state %.0f MiB (what its first step added), activations %.0f "
        "MiB, scratch %.0f MiB, bf16 weight copy %.0f MiB, decoding's bf16 panels %.0f MiB, the rest "
        "(libraries, tokenizer, data, heap) %.0f MiB",
        t->peak_kb[2] / kb, t->peak_kb[0] / kb, t->peak_kb[1] / kb, t->peak_kb[2] / kb, t->rss_kb[2] / kb,
        params, grads, sliced ? " (resident: zero3's slices and its gradient slices' sums)" : "", optimizer,
        opt, acts, scratch, copy, panels, rest);
}
