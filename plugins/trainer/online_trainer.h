/* What the online trainers (grpo, rloo) share, header-only since each plugin is its own .so: the
 * options they both declare, reading them into the ctrl_online_spec and the clip range, and the
 * clipped-ratio surrogate with its gradient as torch computes it. */
#ifndef CTRL_PLUGINS_TRAINER_ONLINE_TRAINER_H
#define CTRL_PLUGINS_TRAINER_ONLINE_TRAINER_H

#include <math.h>

#include <ctrl/plugin_api.h>

/* Option-table entries both trainers declare; the defaults that differ are arguments. */
#define ONLINE_OPTION_NUM_GENERATIONS(default_value, doc)                                                    \
    { "num_generations", CTRL_OPT_INT, default_value, CTRL_OPT_HAS_MIN, 2, 0, NULL, doc }
#define ONLINE_OPTION_BETA(default_value, doc)                                                               \
    { "beta", CTRL_OPT_FLOAT, default_value, CTRL_OPT_HAS_MIN, 0, 0, NULL, doc }
#define ONLINE_OPTIONS_GENERATION                                                                            \
    {"max_completion_length",                                                                                \
     CTRL_OPT_INT,                                                                                           \
     "512",                                                                                                  \
     CTRL_OPT_HAS_MIN,                                                                                       \
     1,                                                                                                      \
     0,                                                                                                      \
     NULL,                                                                                                   \
     "New tokens per completion at most."},                                                                  \
        {"steps_per_generation",                                                                             \
         CTRL_OPT_INT,                                                                                       \
         "0",                                                                                                \
         CTRL_OPT_HAS_MIN,                                                                                   \
         0,                                                                                                  \
         0,                                                                                                  \
         NULL,                                                                                               \
         "Micro-batches one generation batch feeds (0 = gradient_accumulation_steps)."},                     \
        {"num_iterations",                                                                                   \
         CTRL_OPT_INT,                                                                                       \
         "1",                                                                                                \
         CTRL_OPT_HAS_MIN,                                                                                   \
         1,                                                                                                  \
         0,                                                                                                  \
         NULL,                                                                                               \
         "Optimization passes over each generation batch (TRL's mu)."},                                      \
    {                                                                                                        \
        "mask_truncated_completions", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,                                 \
            "Exclude completions cut at max_completion_length from the loss."                                \
    }
#define ONLINE_OPTIONS_CLIP                                                                                  \
    {"epsilon", CTRL_OPT_FLOAT,                                                                              \
     "0.2",     CTRL_OPT_HAS_MIN,                                                                            \
     0,         0,                                                                                           \
     NULL,      "Lower clipping bound: ratio >= 1 - epsilon."},                                              \
    {                                                                                                        \
        "epsilon_high", CTRL_OPT_FLOAT, "0", CTRL_OPT_HAS_MIN, 0, 0, NULL,                                   \
            "Upper clipping bound 1 + epsilon_high (0 = epsilon; DAPO recommends 0.28)."                     \
    }

/* The shared options of [section]: the spec's generation fields and needs_ref_logp (beta != 0),
 * beta, and the clip range [1 - epsilon, 1 + epsilon_high] (epsilon_high 0 = epsilon). The first
 * failure sticks in *st. */
static inline void online_read_options(const ctrl_config *cfg, const char *section, ctrl_online_spec *spec,
                                       double *beta, double *lo, double *hi, ctrl_status *st) {
    *spec = (ctrl_online_spec){
        .size = sizeof(ctrl_online_spec),
        .num_generations = (int)ctrl_option_int(cfg, section, "num_generations", st),
        .max_completion_length = (int)ctrl_option_int(cfg, section, "max_completion_length", st),
        .steps_per_generation = (int)ctrl_option_int(cfg, section, "steps_per_generation", st),
        .num_iterations = (int)ctrl_option_int(cfg, section, "num_iterations", st),
        .mask_truncated_completions = ctrl_option_bool(cfg, section, "mask_truncated_completions", st),
    };
    *beta = ctrl_option_float(cfg, section, "beta", st);
    spec->needs_ref_logp = *beta != 0.0;
    const double eps_low = ctrl_option_float(cfg, section, "epsilon", st);
    double eps_high = ctrl_option_float(cfg, section, "epsilon_high", st);
    if (!(eps_high > 0)) eps_high = eps_low;
    *lo = 1 - eps_low;
    *hi = 1 + eps_high;
}

/* CTRL_OK when a scored generation batch is whole groups (its completions i * group .. i * group +
 * group - 1 answer prompt i), as the advantages need. */
static inline ctrl_status online_check_groups(const char *trainer, const ctrl_rollout *r) {
    if (r->group < 1 || r->n % r->group)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "trainer %s: %d completions are not groups of %d", trainer,
                              r->n, r->group);
    return CTRL_OK;
}

/* The ratio c1 = pi / pi_old capped at delta when delta > 0 (GRPO's two-sided clipping). */
static inline double online_capped(double c1, double delta) { return delta > 0 && c1 > delta ? delta : c1; }

/* The clipped surrogate -min(capped(c1) A, clamp(c1, lo, hi) A), with its derivative in c1 written
 * to *dc1 as torch computes it: minimum splits the gradient evenly on ties, the cap and clamp pass
 * it only where they do not bind. */
static inline double online_clipped_loss(double c1, double A, double lo, double hi, double delta,
                                         double *dc1) {
    const int capped = delta > 0 && c1 > delta;
    const double c1d = capped ? delta : c1, c2 = c1 < lo ? lo : c1 > hi ? hi : c1;
    const double da = capped ? 0 : A, db = (c1 >= lo && c1 <= hi) ? A : 0;
    const double a = c1d * A, b = c2 * A;
    *dc1 = a < b ? -da : a > b ? -db : -(da + db) / 2;
    return -fmin(a, b);
}

/* TRL's clip metrics of one (capped) ratio: clipped below with a negative advantage, or above
 * with a positive one. */
static inline int online_clipped_low(double c1d, double A, double lo) { return c1d < lo && A < 0; }
static inline int online_clipped_high(double c1d, double A, double hi) { return c1d > hi && A > 0; }

#endif
