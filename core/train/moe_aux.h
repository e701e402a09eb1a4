/* The mixture-of-experts router load-balancing loss every trainer of the policy adds, as TRL's
 * trainers do (aux_loss_enabled: the model is an MoE, whose config has output_router_logits, and the
 * coefficient is not 0): each micro-batch's loss gets coef x aux / accumulation steps -- SFT, DPO, KTO
 * and GRPO scale it so, RLOO leaves it to the HF Trainer's division, which is the same -- and its
 * gradient through the routers; evaluation adds coef x aux to each batch's loss. aux is transformers'
 * load_balancing_loss_func over the tokens the batch's attention mask keeps
 * (ctrl_model_moe_aux_loss), and TRL's aux_loss metric is its mean over the logged micro-batches. */
#ifndef CTRL_CORE_TRAIN_MOE_AUX_H
#define CTRL_CORE_TRAIN_MOE_AUX_H

#include <stdint.h>

#include "config/config_load.h"
#include "model/model.h"

/* The coefficient a run trains with: [train] router_aux_loss_coef when set, else the model config's;
 * 0 on a dense model (no auxiliary loss). */
double train_moe_aux_coef(const ctrl_run_settings *s, const ctrl_model *m);

/* Refuses [train] router_aux_loss_coef > 0 on a dense model (TRL raises there), naming file:line. */
ctrl_status train_moe_aux_check(const ctrl_config *cfg, const ctrl_model *m);

/* For a trainer that does not add it (GKD: TRL's GKDTrainer does not): a [train] router_aux_loss_coef
 * > 0 is refused naming file:line, the model config's coefficient is left out with a warning. */
ctrl_status train_moe_aux_not_added(const ctrl_config *cfg, const ctrl_model *m, const char *trainer);

/* After the policy's forward over a batch whose tokens `mask` keeps ([T]; NULL: all of them): with
 * coef != 0, aux into *aux, coef x aux / div added to *loss, the metric "aux_loss" reported (report may
 * be NULL), and with `train` the next backward armed with its gradient. coef 0: nothing (*aux = 0). */
ctrl_status train_moe_aux_add(ctrl_model *m, double coef, const uint8_t *mask, double div, int train,
                              double *loss, double *aux,
                              void (*report)(void *ctx, const char *name, double v), void *report_ctx);

#endif
