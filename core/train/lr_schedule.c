/* Learning-rate schedules with transformers' semantics (optimization.py): the multiplier for
 * optimizer step s (0-based), with linear warmup from 0 over `warmup` steps. */
#include <math.h>
#include <string.h>

#include "train/train.h"

double ctrl_lr_at(const char *kind, double lr, long step, long total, long warmup, double min_lr_rate) {
    if (!strcmp(kind, "constant")) return lr;
    if (step < warmup) return lr * (double)step / (double)(warmup > 0 ? warmup : 1);
    if (!strcmp(kind, "constant_with_warmup")) return lr;
    double progress = (double)(step - warmup) / (double)(total - warmup > 0 ? total - warmup : 1);
    if (!strcmp(kind, "linear"))
        return lr * fmax(0.0, (double)(total - step) / (double)(total - warmup > 0 ? total - warmup : 1));
    if (!strcmp(kind, "cosine")) return lr * fmax(0.0, 0.5 * (1.0 + cos(M_PI * progress)));
    if (!strcmp(kind, "cosine_with_min_lr")) {
        double c = 0.5 * (1.0 + cos(M_PI * progress));
        return lr * (c * (1.0 - min_lr_rate) + min_lr_rate);
    }
    return lr;
}
