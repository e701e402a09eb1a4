/* The mixture-of-experts load-balancing loss of the trainers (see moe_aux.h). */
#include "train/moe_aux.h"

double train_moe_aux_coef(const ctrl_run_settings *s, const ctrl_model *m) {
    const ctrl_model_config *c = ctrl_model_cfg(m);
    if (c->n_experts <= 0) return 0;
    return s->train.router_aux_loss_coef >= 0 ? s->train.router_aux_loss_coef
                                              : (double)c->router_aux_loss_coef;
}

ctrl_status train_moe_aux_check(const ctrl_config *cfg, const ctrl_model *m) {
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    if (ctrl_model_cfg(m)->n_experts > 0 || !(s->train.router_aux_loss_coef > 0)) return CTRL_OK;
    return ctrl_error_set(CTRL_ERR_CONFIG,
                          "%s: [train] router_aux_loss_coef = %g: the model is not a mixture of experts, "
                          "there is no router load-balancing loss to weight (drop the key, or set 0)",
                          ctrl_config_where(cfg, "train", "router_aux_loss_coef"),
                          s->train.router_aux_loss_coef);
}

ctrl_status train_moe_aux_not_added(const ctrl_config *cfg, const ctrl_model *m, const char *trainer) {
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    const double coef = train_moe_aux_coef(s, m);
    if (coef == 0) return CTRL_OK;
    if (s->train.router_aux_loss_coef > 0)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "%s: [train] router_aux_loss_coef = %g: trainer %s does not add the router "
                              "load-balancing loss (TRL's does not either); drop the key",
                              ctrl_config_where(cfg, "train", "router_aux_loss_coef"), coef, trainer);
    CTRL_WARN("model config router_aux_loss_coef = %g: trainer %s does not add the router load-balancing "
              "loss (as TRL's); the routers train on the trainer's loss alone",
              coef, trainer);
    return CTRL_OK;
}

ctrl_status train_moe_aux_add(ctrl_model *m, double coef, const uint8_t *mask, double div, int train,
                              double *loss, double *aux,
                              void (*report)(void *ctx, const char *name, double v), void *report_ctx) {
    *aux = 0;
    if (coef == 0) return CTRL_OK;
    const ctrl_status st = ctrl_model_moe_aux_loss(m, mask, train ? (float)(coef / div) : 0.0f, aux);
    if (st != CTRL_OK) return st;
    *loss += coef * *aux / div;
    if (report) report(report_ctx, "aux_loss", *aux);
    return CTRL_OK;
}
