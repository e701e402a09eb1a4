/* Training health, checked by the step loop for every kind of trainer: a non-finite loss or
 * gradient norm stops the run (nothing of that step is applied or saved; the loop names the last
 * good checkpoint), and a gradient norm that is exactly 0 over TRAIN_HEALTH_ZERO_WINDOWS
 * consecutive logging windows -- a collapsed model (e.g. a learning rate of 1e6 drives SFT to a
 * uniform distribution with no gradient left), or no learning signal at all -- is warned about,
 * once per run. */
#ifndef CTRL_CORE_TRAIN_HEALTH_H
#define CTRL_CORE_TRAIN_HEALTH_H

#include <ctrl/log.h>
#include <ctrl/status.h>

#define TRAIN_HEALTH_ZERO_WINDOWS 3

typedef struct train_health {
    int zero_windows; /* consecutive logging windows whose every step had grad_norm == 0 */
    long zero_steps;  /* the steps they hold */
    int warned;
} train_health;

/* After a step's gradients are accumulated, before they are applied: CTRL_ERR_RUNTIME naming the
 * step and the value when the loss or the gradient norm is not finite. */
ctrl_status train_health_step(long step, double loss, double grad_norm);
/* At each logging window: its step count and mean gradient norm and loss, the learning rate. */
void train_health_window(train_health *h, long step, int steps, double mean_grad_norm, double mean_loss,
                         double lr);

#endif
