/* The typed settings of a validated config (config_load.h: ctrl_run_settings): read once, after
 * the defaults are filled, so that the loops never read the config by string. */
#include <string.h>

#include "config/config_internal.h"

void config_settings_fill(ctrl_config *cfg) {
    ctrl_run_settings *s = &cfg->settings;
    const char *mode = ctrl_config_get_string(cfg, "generation", "mode");
    const char *only = ctrl_config_get_string(cfg, "data", "completion_only_loss");
    *s = (ctrl_run_settings){
        .run = {.trainer = ctrl_config_get_string(cfg, "run", "trainer"),
                .output_dir = ctrl_config_get_string(cfg, "run", "output_dir"),
                .device = ctrl_config_get_string(cfg, "run", "device"),
                .seed = (uint64_t)ctrl_config_get_int(cfg, "run", "seed", 42)},
        .model = {.path = ctrl_config_get_string(cfg, "model", "path")},
        .data = {.train_file = ctrl_config_get_string(cfg, "data", "train_file"),
                 .eval_file = ctrl_config_get_string(cfg, "data", "eval_file"),
                 .chat_template_path = ctrl_config_get_string(cfg, "data", "chat_template_path"),
                 .dataset_text_field = ctrl_config_get_string(cfg, "data", "dataset_text_field"),
                 .messages_field = ctrl_config_get_string(cfg, "data", "messages_field"),
                 .prompt_field = ctrl_config_get_string(cfg, "data", "prompt_field"),
                 .completion_field = ctrl_config_get_string(cfg, "data", "completion_field"),
                 .truncation_mode = ctrl_config_get_string(cfg, "data", "truncation_mode"),
                 .packing_strategy = ctrl_config_get_string(cfg, "data", "packing_strategy"),
                 .completion_only_loss = !only || !strcmp(only, "auto") ? -1 : !strcmp(only, "true"),
                 .eval_packing = ctrl_config_has(cfg, "data", "eval_packing")
                                     ? ctrl_config_get_bool(cfg, "data", "eval_packing", false)
                                     : -1,
                 .eval_fraction = ctrl_config_get_float(cfg, "data", "eval_fraction", 0),
                 .max_length = (int)ctrl_config_get_int(cfg, "data", "max_length", 1024),
                 .pad_to_multiple_of = (int)ctrl_config_get_int(cfg, "data", "pad_to_multiple_of", 0),
                 .packing = ctrl_config_get_bool(cfg, "data", "packing", false),
                 .padding_free = ctrl_config_get_bool(cfg, "data", "padding_free", true),
                 .assistant_only_loss = ctrl_config_get_bool(cfg, "data", "assistant_only_loss", false),
                 .shuffle = ctrl_config_get_bool(cfg, "data", "shuffle", true),
                 .skip_bad_rows = ctrl_config_get_bool(cfg, "data", "skip_bad_rows", false)},
        .train = {.optimizer = ctrl_config_get_string(cfg, "train", "optimizer"),
                  .dtype = ctrl_config_get_string(cfg, "train", "dtype"),
                  .lr_scheduler_type = ctrl_config_get_string(cfg, "train", "lr_scheduler_type"),
                  .save_strategy = ctrl_config_get_string(cfg, "train", "save_strategy"),
                  .resume_from_checkpoint = ctrl_config_get_string(cfg, "train", "resume_from_checkpoint"),
                  .learning_rate = ctrl_config_get_float(cfg, "train", "learning_rate", 2e-5),
                  .min_lr_rate = ctrl_config_get_float(cfg, "train", "min_lr_rate", 0),
                  .warmup_ratio = ctrl_config_get_float(cfg, "train", "warmup_ratio", 0),
                  .num_train_epochs = ctrl_config_get_float(cfg, "train", "num_train_epochs", 3),
                  .max_grad_norm = ctrl_config_get_float(cfg, "train", "max_grad_norm", 1.0),
                  .weight_decay = ctrl_config_get_float(cfg, "train", "weight_decay", 0),
                  .max_steps = (long)ctrl_config_get_int(cfg, "train", "max_steps", -1),
                  .warmup_steps = (long)ctrl_config_get_int(cfg, "train", "warmup_steps", 0),
                  .logging_steps = (long)ctrl_config_get_int(cfg, "train", "logging_steps", 10),
                  .eval_steps = (long)ctrl_config_get_int(cfg, "train", "eval_steps", 0),
                  .save_steps = (long)ctrl_config_get_int(cfg, "train", "save_steps", 500),
                  .per_device_train_batch_size =
                      (int)ctrl_config_get_int(cfg, "train", "per_device_train_batch_size", 8),
                  .per_device_eval_batch_size =
                      (int)ctrl_config_get_int(cfg, "train", "per_device_eval_batch_size", 8),
                  .gradient_accumulation_steps =
                      (int)ctrl_config_get_int(cfg, "train", "gradient_accumulation_steps", 1),
                  .save_total_limit = (int)ctrl_config_get_int(cfg, "train", "save_total_limit", 0)},
        .generation = {.server = mode && !strcmp(mode, "server"),
                       .server_url = ctrl_config_get_string(cfg, "generation", "server_url"),
                       .temperature = ctrl_config_get_float(cfg, "generation", "temperature", 1.0),
                       .top_p = ctrl_config_get_float(cfg, "generation", "top_p", 1.0),
                       .min_p = ctrl_config_get_float(cfg, "generation", "min_p", 0.0),
                       .repetition_penalty =
                           ctrl_config_get_float(cfg, "generation", "repetition_penalty", 1.0),
                       .top_k = (int)ctrl_config_get_int(cfg, "generation", "top_k", 0),
                       .sleep = (int)ctrl_config_get_int(cfg, "generation", "sleep", 0),
                       .log_completions = ctrl_config_get_bool(cfg, "generation", "log_completions", false)}};
    for (int i = 0; i < cfg->plugins.n_rewards; i++)
        cfg->plugins.reward[i].weight =
            ctrl_config_get_float(cfg, cfg->plugins.reward[i].section, "weight", 1.0);
}

const ctrl_run_plugins *ctrl_config_plugins(const ctrl_config *cfg) { return &cfg->plugins; }
const ctrl_run_settings *ctrl_config_settings(const ctrl_config *cfg) { return &cfg->settings; }
