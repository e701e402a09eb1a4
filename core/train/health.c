/* Training health checks (see health.h). */
#include <math.h>

#include "train/health.h"

ctrl_status train_health_step(long step, double loss, double grad_norm) {
    if (isfinite(loss) && isfinite(grad_norm)) return CTRL_OK;
    return ctrl_error_set(CTRL_ERR_RUNTIME,
                          "step %ld: non-finite %s (%g); stopping, nothing of this step is saved", step + 1,
                          isfinite(loss) ? "grad_norm" : "loss", isfinite(loss) ? grad_norm : loss);
}

void train_health_window(train_health *h, long step, int steps, double mean_grad_norm, double mean_loss,
                         double lr) {
    if (mean_grad_norm != 0) { /* norms are >= 0: a zero mean is a window of zero norms */
        h->zero_windows = 0, h->zero_steps = 0;
        return;
    }
    h->zero_windows++, h->zero_steps += steps;
    if (h->warned || h->zero_windows < TRAIN_HEALTH_ZERO_WINDOWS) return;
    h->warned = 1;
    CTRL_WARN(
        "step %ld: grad_norm has been exactly 0 for the last %ld steps (%d logged windows): the model "
        "is not learning. It may have collapsed (loss %.6g; learning rate %g -- too high a learning rate "
        "drives a model to a uniform distribution with no gradient left), or nothing trained carries a "
        "gradient (online trainers: equal rewards within every group give zero advantages). Training "
        "goes on; this is said once.",
        step, h->zero_steps, h->zero_windows, mean_loss, lr);
}
