/* Bad configs: each case must fail with the right status and a message naming the file, the
 * line (where there is one), the key, and a suggestion where one fits. Nothing may crash. */
#include "config_test_support.h"
#include "test.h"

#include <sys/stat.h>

typedef struct bad_case {
    const char *name;    /* also the file name: <name>.ini */
    const char *ini;     /* file content (NULL = do not create the file) */
    const char *sets[3]; /* --set overrides */
    ctrl_status status;
    const char *expect[4]; /* substrings the message must contain ("@" = the file name) */
} bad_case;

static const bad_case cases[] = {
    {"empty", "", {0}, CTRL_ERR_CONFIG, {"@", "empty"}},
    {"comments_only", "; nothing\n# here\n\n", {0}, CTRL_ERR_CONFIG, {"@", "empty"}},
    {"no_equals", BASE_INI "learning_rate 3\n", {0}, CTRL_ERR_CONFIG, {"@:7", "expected 'key = value'"}},
    {"open_section", "[run\ntrainer = sft\n", {0}, CTRL_ERR_CONFIG, {"@:1", "closing ']'"}},
    {"text_after_section", "[run] extra\n", {0}, CTRL_ERR_CONFIG, {"@:1", "after section header"}},
    {"empty_section_name", "[]\n", {0}, CTRL_ERR_CONFIG, {"@:1", "empty section name"}},
    {"key_outside_section",
     "seed = 1\n[run]\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:1", "seed", "outside any [section]"}},
    {"duplicate_key",
     BASE_INI "learning_rate = 1e-4\nlearning_rate = 2e-4\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:8", "learning_rate", "duplicate key", "first at line 7"}},
    {"duplicate_section",
     BASE_INI "[run]\nseed = 3\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "[run]", "duplicate section", "first at line 1"}},
    {"unknown_section",
     BASE_INI "[trian]\nseed = 1\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "[trian]", "unknown section", "did you mean [train]"}},
    {"unknown_key",
     BASE_INI "learning_rat = 3e-4\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "learning_rat", "unknown key", "did you mean 'learning_rate'"}},
    {"trl_name_gradient_checkpointing",
     BASE_INI "gradient_checkpointing = true\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "unknown key", "TRL's gradient_checkpointing is ctrl's [memory] strategies = checkpointing"}},
    {"trl_name_max_seq_length",
     BASE_INI "max_seq_length = 512\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "unknown key", "TRL's max_seq_length is ctrl's [data] max_length"}},
    {"trl_name_seed_in_train",
     BASE_INI "seed = 3\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "[train] seed", "TRL's seed is ctrl's [run] seed"}},
    {"model_dtype_removed",
     "[model]\npath = m\ndtype = bfloat16\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:3", "[model] dtype", "unknown key"}},
    {"bad_int",
     BASE_INI "per_device_train_batch_size = 8x\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "per_device_train_batch_size", "expected an integer"}},
    {"float_for_int",
     BASE_INI "gradient_accumulation_steps = 2.5\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "gradient_accumulation_steps", "whole number"}},
    {"empty_int",
     BASE_INI "max_steps =\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "max_steps", "expected an integer"}},
    {"bad_float",
     BASE_INI "learning_rate = fast\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "learning_rate", "expected a number"}},
    {"bad_bool",
     "[run]\n[model]\npath = m\n[data]\npacking = maybe\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:5", "packing", "true or false"}},
    {"negative_lr",
     BASE_INI "learning_rate = -1e-4\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "learning_rate", "out of range", "> 0"}},
    {"subnormal_repetition_penalty", /* issue 15: it overflowed the logits to inf, then NaN */
     BASE_INI "[generation]\nrepetition_penalty = 1e-45\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@", "repetition_penalty", "out of range"}},
    {"zero_accumulation",
     BASE_INI "gradient_accumulation_steps = 0\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "gradient_accumulation_steps", "out of range", ">= 1"}},
    {"fraction_above_range",
     "[model]\npath = m\n[data]\neval_fraction = 0.9\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:4", "eval_fraction", "out of range", "[0, 0.5]"}},
    {"bad_choice",
     BASE_INI "lr_scheduler_type = cosin\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "lr_scheduler_type", "expected one of", "did you mean 'cosine'"}},
    {"bad_list_item",
     "[model]\npath = m\n[peft]\ntarget_modules = q_proj, qq_proj\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:4", "target_modules", "qq_proj", "did you mean 'q_proj'"}},
    /* [peft] enabled works (tests/e2e/test_lora_train.sh); what does not is refused by key */
    {"peft_adapter_path_and_use_dora",
     BASE_INI "[peft]\nenabled = true\nadapter_path = a\nuse_dora = true\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:10", "[peft] use_dora", "adapter_path"}},
    /* PEFT's other choices of modules (settings_peft.c): checked when the config is, by file, line and key */
    {"peft_regex_and_list",
     BASE_INI "[peft]\nenabled = true\ntarget_modules = q_proj\ntarget_modules_regex = .*q_proj\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:10", "target_modules_regex", "together with target_modules", "@:9"}},
    {"peft_layers_pattern_alone",
     BASE_INI "[peft]\nenabled = true\nlayers_pattern = layers\n",
     {0},
     CTRL_ERR_CONFIG,
     {"layers_pattern is given without layers_to_transform"}},
    {"peft_rank_pattern_not_json",
     BASE_INI "[peft]\nenabled = true\nrank_pattern = q_proj: 8\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:9", "[peft] rank_pattern", "not a JSON object"}},
    {"peft_layer_not_a_number",
     BASE_INI "[peft]\nenabled = true\nlayers_to_transform = 0, one\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:9", "[peft] layers_to_transform", "'one' is not a layer index"}},
    {"peft_exclude_regex_invalid",
     BASE_INI "[peft]\nenabled = true\nexclude_modules_regex = (.*\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:9", "[peft] exclude_modules_regex", "'(.*'", "not a valid regular expression"}},
    /* an adapter's setting with [peft] enabled left unset would be ignored: refused by key */
    {"peft_key_without_enabled",
     BASE_INI "[peft]\nr = 8\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:8", "[peft] r is set but [peft] enabled is not"}},
    /* trainable_token_indices (settings_peft.c, validate.c) */
    {"peft_token_not_a_number",
     BASE_INI "[peft]\nenabled = true\ntrainable_token_indices = 5, six\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:9", "[peft] trainable_token_indices", "'six' is not a token id"}},
    {"peft_token_twice",
     BASE_INI "[peft]\nenabled = true\ntrainable_token_indices = 5, 7, 5\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:9", "[peft] trainable_token_indices", "token index 5 is listed twice"}},
    {"peft_tokens_and_embed_tokens_saved",
     BASE_INI "[peft]\nenabled = true\nmodules_to_save = embed_tokens\ntrainable_token_indices = 5\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:10", "trainable_token_indices with modules_to_save = embed_tokens", "@:9"}},
    {"peft_head_tokens_and_lm_head_saved",
     BASE_INI "[peft]\nenabled = true\nmodules_to_save = lm_head\ntrainable_token_indices_lm_head = 5\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:10", "trainable_token_indices_lm_head with modules_to_save = lm_head", "@:9"}},
    {"peft_tokens_with_zero3",
     BASE_INI "[memory]\nstrategies = zero3\n[peft]\nenabled = true\ntrainable_token_indices = 5\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:11", "trainable_token_indices with [memory] strategies = zero3"}},
    {"peft_tokens_with_bf16_table",
     BASE_INI "[peft]\nenabled = true\nembedding_dtype = bf16\ntrainable_token_indices = 5\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:9", "embedding_dtype = bf16 with trainable_token_indices", "@:10"}},
    {"peft_bias_not_implemented",
     BASE_INI "[peft]\nenabled = true\nbias = all\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:9", "[peft] bias = all", "only none"}},
    /* values PEFT knows that ctrl does not implement: refused by key, never trained as the default */
    {"peft_quantization_not_nf4",
     BASE_INI "[peft]\nenabled = true\nquantization = fp4\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:9", "quantization", "'fp4'", "expected one of none,nf4"}},
    {"peft_init_lora_weights_pissa_niter",
     BASE_INI "[peft]\nenabled = true\ninit_lora_weights = pissa_niter_4\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:9", "init_lora_weights", "'pissa_niter_4'", "expected one of true,false,gaussian,pissa,olora"}},
    {"peft_adapter_path_and_r",
     BASE_INI "[peft]\nenabled = true\nadapter_path = a\nr = 8\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:10", "[peft] r", "adapter_path"}},
    {"peft_embedding_bf16_without_peft",
     BASE_INI "[peft]\nembedding_dtype = bf16\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:8", "[peft] embedding_dtype = bf16", "enabled = true"}},
    {"peft_embedding_bf16_fp32_compute",
     BASE_INI "dtype = fp32\n[peft]\nenabled = true\nembedding_dtype = bf16\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:10", "[peft] embedding_dtype = bf16", "[train] dtype = bf16", "fp32"}},
    {"peft_embedding_bf16_on_cuda",
     BASE_INI "[peft]\nenabled = true\nembedding_dtype = bf16\n",
     {"run.device=cuda"},
     CTRL_ERR_CONFIG,
     {"@:9", "[peft] embedding_dtype = bf16", "device = cuda", "CPU only"}},
    {"peft_embedding_bf16_zero3",
     BASE_INI "[memory]\nstrategies = zero3\n[peft]\nenabled = true\nembedding_dtype = bf16\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:11", "[peft] embedding_dtype = bf16", "zero3"}},
    {"peft_embedding_bf16_trained",
     BASE_INI "[peft]\nenabled = true\nmodules_to_save = embed_tokens\nembedding_dtype = bf16\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:10", "[peft] embedding_dtype = bf16", "modules_to_save = embed_tokens", "frozen"}},
    {"missing_required",
     "[run]\nseed = 1\n[model]\ndtype = float32\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:3", "[model] path", "required key is missing"}},
    {"missing_required_section",
     "[run]\nseed = 1\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@", "[model] path", "required"}},
    {"unknown_trainer",
     "[run]\ntrainer = sfy\n[model]\npath = m\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:2", "trainer = 'sfy'", "did you mean 'sft'", "loaded: dpo, sft"}},
    {"unknown_optimizer",
     BASE_INI "[adamw]\n",
     {"train.optimizer=lion"},
     CTRL_ERR_CONFIG,
     {"--set train.optimizer", "'lion'", "no optimizer plugin", "loaded: adamw, sgd"}},
    {"unknown_attention",
     "[model]\npath = m\nattention = flsh\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:3", "attention = 'flsh'", "did you mean 'flash'"}},
    {"unknown_memory",
     "[model]\npath = m\n[memory]\nstrategies = checkpointing, ofload\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:4", "strategies", "'ofload'", "did you mean 'offload'"}},
    {"prefetch_bucket_text",
     "[model]\npath = m\n[memory]\nprefetch_bucket_size = lots\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:4", "[memory] prefetch_bucket_size = lots", "expected auto or a whole number of floats"}},
    {"reduce_bucket_zero",
     "[model]\npath = m\n[memory]\nreduce_bucket_size = 0\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:4", "[memory] reduce_bucket_size = 0", "expected auto or a whole number of floats >= 1"}},
    {"prefetch_bucket_negative",
     "[model]\npath = m\n",
     {"memory.prefetch_bucket_size=-5e7"},
     CTRL_ERR_CONFIG,
     {"--set memory.prefetch_bucket_size", "= -5e7", "expected auto"}},
    {"duplicate_memory",
     "[model]\npath = m\n[memory]\nstrategies = offload, offload\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:4", "offload", "listed twice"}},
    {"unselected_trainer_section",
     BASE_INI "[dpo]\nbeta = 0.2\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "[dpo]", "trainer 'dpo'", "[run] trainer"}},
    {"unselected_attention_section",
     "[model]\npath = m\nattention = flash\n[attention.eager]\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:4", "[attention.eager]", "[model] attention = flash"}},
    {"plugin_key_unknown",
     BASE_INI "[adamw]\nbeta1 = 0.8\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:8", "beta1", "did you mean 'adam_beta1'"}},
    {"plugin_key_range",
     BASE_INI "[adamw]\nadam_beta1 = 1.0\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:8", "adam_beta1", "out of range", "[0, 1)"}},
    {"plugin_without_options",
     BASE_INI "[sft]\nmax_seq = 3\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:8", "max_seq", "trainer 'sft' has no options"}},
    {"reward_without_plugin",
     BASE_INI "[reward.len]\nweight = 2\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "[reward.len] plugin", "required key is missing"}},
    {"reward_unknown_plugin",
     BASE_INI "[reward.len]\nplugin = lenght\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:8", "plugin = 'lenght'", "no reward plugin", "did you mean 'length'"}},
    {"reward_option_choice",
     BASE_INI "[reward.len]\nplugin = length\nunit = words\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:9", "unit = 'words'", "chars,tokens"}},
    {"reward_unnamed",
     BASE_INI "[reward.]\nplugin = length\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "[reward.NAME]"}},
    {"set_without_equals",
     BASE_INI,
     {"train.learning_rate"},
     CTRL_ERR_CONFIG,
     {"--set train.learning_rate", "section.key=value"}},
    {"set_without_section", BASE_INI, {"seed=3"}, CTRL_ERR_CONFIG, {"--set seed=3", "section"}},
    {"set_unknown_key", BASE_INI, {"train.lr=3"}, CTRL_ERR_CONFIG, {"--set train.lr", "unknown key"}},
    {"set_out_of_range",
     BASE_INI,
     {"train.gradient_accumulation_steps=0"},
     CTRL_ERR_CONFIG,
     {"--set train.gradient_accumulation_steps", "out of range"}},
    {"set_unknown_section",
     BASE_INI,
     {"trian.seed=1"},
     CTRL_ERR_CONFIG,
     {"--set", "[trian]", "unknown section", "did you mean [train]"}},
    {"bad_device",
     "[run]\ndevice = cuda:x\n[model]\npath = m\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:2", "device = 'cuda:x'", "cuda:N"}},
    {"bad_key_chars", BASE_INI "learning rate = 3\n", {0}, CTRL_ERR_CONFIG, {"@:7", "learning rate"}},
    /* Constructs iniparser would misread or reject without a line: refused with their line. */
    {"comment_after_section",
     "[run] ; the run\n[model]\npath = m\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:1", "comment after a section header"}},
    {"line_continuation",
     "[model]\npath = m \\\nattention = eager\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:2", "line ends with '\\'"}},
    {"comment_continuation",
     "[model]\n; see C:\\\npath = m\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:2", "join the next line"}},
    {"utf8_bom", "\xef\xbb\xbf[model]\npath = m\n", {0}, CTRL_ERR_CONFIG, {"@:1", "byte-order mark"}},
    {"utf16", "\xff\xfe[", {0}, CTRL_ERR_CONFIG, {"@:1", "UTF-16"}},
    {"unterminated_quote",
     "[model]\npath = \"models/x\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:2", "[model] path", "unterminated quote"}},
    {"text_after_quote",
     "[model]\npath = 'models/x' extra\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:2", "[model] path", "after the closing quote", "extra"}},
    {"int_overflow",
     BASE_INI "max_steps = 99999999999999999999\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "max_steps", "too large for a 64-bit integer"}},
    {"float_infinite",
     BASE_INI "learning_rate = 1e999\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "learning_rate", "not a finite number"}},
    {"float_nan",
     BASE_INI "max_grad_norm = nan\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "max_grad_norm", "a number"}},
    {"empty_float",
     BASE_INI "learning_rate =\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "learning_rate", "empty value"}},
    {"device_signed_index",
     "[run]\ndevice = cuda:+1\n[model]\npath = m\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:2", "device = 'cuda:+1'", "cuda:N"}},
    {"device_unknown", "[run]\ndevice = gpu\n[model]\npath = m\n", {0}, CTRL_ERR_CONFIG, {"@:2", "'gpu'"}},
    {"empty_path", "[model]\npath =\n", {0}, CTRL_ERR_CONFIG, {"@:2", "[model] path", "empty path"}},
    {"empty_trainer",
     "[run]\ntrainer =\n[model]\npath = m\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:2", "trainer = ''", "loaded: dpo, sft"}},
    /* Sections of plugins that exist but that the run does not use. */
    {"unselected_optimizer_section",
     BASE_INI "[sgd]\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "[sgd]", "optimizer 'sgd'", "but [train] optimizer = adamw"}},
    {"unselected_memory_section",
     "[model]\npath = m\n[memory]\nstrategies = checkpointing\n[offload]\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:5", "[offload]", "strategies = checkpointing does not list it"}},
    {"unselected_trainer_value",
     BASE_INI "[dpo]\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "[dpo]", "but [run] trainer = sft"}},
    {"plugin_section_typo",
     BASE_INI "[dpoo]\nbeta = 0.2\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "[dpoo]", "unknown section", "did you mean [dpo]"}},
    {"attention_section_typo",
     "[model]\npath = m\nattention = flash\n[attention.flsh]\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:4", "[attention.flsh]", "did you mean [attention.flash]"}},
    {"unknown_section_no_match",
     BASE_INI "[zzzzzzzz]\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "[zzzzzzzz]", "unknown section", "[reward.NAME]"}},
    /* Reward functions. */
    {"reward_key_before_plugin",
     BASE_INI "[reward.len]\ntarget_length = 3\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "[reward.len] plugin", "required key is missing", "loaded: length"}},
    {"reward_key_typo",
     BASE_INI "[reward.len]\nplugin = length\ntarget_lenght = 3\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:9", "target_lenght", "did you mean 'target_length'"}},
    {"reward_bad_weight",
     BASE_INI "[reward.len]\nplugin = length\nweight = heavy\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:9", "[reward.len] weight", "expected a number"}},
    /* Overrides. */
    {"set_reward_without_plugin",
     BASE_INI,
     {"reward.x.weight=3"},
     CTRL_ERR_CONFIG,
     {"--set reward.x.weight", "[reward.x] plugin", "required key is missing"}},
    {"set_unselected_section",
     BASE_INI,
     {"dpo.beta=0.3"},
     CTRL_ERR_CONFIG,
     {"--set dpo.beta", "[dpo]", "but [run] trainer = sft"}},
    {"set_control_character",
     BASE_INI,
     {"train.optimizer=adamw\n[x]"},
     CTRL_ERR_CONFIG,
     {"--set train.optimizer", "control character"}},
    {"set_bad_name",
     BASE_INI,
     {"train.learning rate=3"},
     CTRL_ERR_CONFIG,
     {"--set train.learning rate=3", "letters, digits"}},
    {"set_empty_key", BASE_INI, {"train.=3"}, CTRL_ERR_CONFIG, {"--set train.=3", "section.key=value"}},
    {"set_empty_section", BASE_INI, {".seed=3"}, CTRL_ERR_CONFIG, {"--set .seed=3", "section.key=value"}},
    {"set_bad_bool",
     BASE_INI,
     {"data.packing=maybe"},
     CTRL_ERR_CONFIG,
     {"--set data.packing", "true or false"}},
    {"set_empty_int",
     BASE_INI,
     {"train.max_steps="},
     CTRL_ERR_CONFIG,
     {"--set train.max_steps", "empty value"}},
    {"set_bad_choice",
     BASE_INI,
     {"train.dtype=bf61"},
     CTRL_ERR_CONFIG,
     {"--set train.dtype", "bf16,fp16,fp32", "did you mean 'bf16'"}},
    {"bf16_fallback_bad_value",
     BASE_INI "bf16_fallback = emulated\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "bf16_fallback", "fp32", "rounded"}},
    {"set_bf16_fallback_bad_value",
     BASE_INI,
     {"train.bf16_fallback=fp16"},
     CTRL_ERR_CONFIG,
     {"--set train.bf16_fallback", "fp32,rounded", "did you mean 'fp32'"}},
    {"set_unknown_memory",
     BASE_INI,
     {"memory.strategies=checkpointing,zero4"},
     CTRL_ERR_CONFIG,
     {"--set memory.strategies", "'zero4'", "no memory plugin", "loaded: checkpointing, offload"}},
    {"trainer_wrong_case",
     "[run]\ntrainer = SFT\n[model]\npath = m\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:2", "trainer = 'SFT'", "did you mean 'sft'"}},
    {"choice_wrong_case",
     BASE_INI "lr_scheduler_type = Cosine\n",
     {0},
     CTRL_ERR_CONFIG,
     {"@:7", "lr_scheduler_type", "did you mean 'cosine'"}},
    {"set_later_wins_still_checked",
     BASE_INI,
     {"train.learning_rate=1e-4", "train.learning_rate=-1"},
     CTRL_ERR_CONFIG,
     {"--set train.learning_rate", "out of range"}},
};

static void run_case(const bad_case *c, ctrl_registry *reg) {
    char fname[128];
    snprintf(fname, sizeof fname, "%s.ini", c->name);
    const char *path = write_ini(fname, c->ini, 0);
    CHECK(path != NULL);
    char file[512];
    snprintf(file, sizeof file, "%s", path);
    int n_sets = 0;
    while (n_sets < 3 && c->sets[n_sets]) n_sets++;
    ctrl_config *cfg = NULL;
    ctrl_status st = ctrl_config_load(file, c->sets, n_sets, reg, &cfg);
    const char *msg = ctrl_error_message();
    CHECK_MSG(st == c->status, "%s: status %s, expected %s (message: %s)", c->name, ctrl_status_name(st),
              ctrl_status_name(c->status), msg);
    CHECK_MSG(cfg == NULL, "%s: a config was returned on error", c->name);
    for (int i = 0; i < 4 && c->expect[i]; i++) {
        char want[600];
        if (c->expect[i][0] == '@')
            snprintf(want, sizeof want, "%s%s", file, c->expect[i] + 1);
        else
            snprintf(want, sizeof want, "%s", c->expect[i]);
        CHECK_MSG(strstr(msg, want) != NULL, "%s: message lacks \"%s\": %s", c->name, want, msg);
    }
    ctrl_config_free(cfg);
}

TEST(bad_inputs) {
    ctrl_registry *reg = test_registry();
    CHECK(reg != NULL);
    int n = (int)(sizeof cases / sizeof cases[0]);
    CHECK(n >= 25);
    for (int i = 0; i < n; i++) run_case(&cases[i], reg);
    printf("  %d bad-input cases\n", n);
    ctrl_registry_destroy(reg);
}

TEST(missing_file_and_directory) {
    ctrl_registry *reg = test_registry();
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load("/nonexistent/run.ini", NULL, 0, reg, &cfg), CTRL_ERR_IO);
    CHECK_CONTAINS(ctrl_error_message(), "/nonexistent/run.ini");
    CHECK_CONTAINS(ctrl_error_message(), "No such file");
    CHECK_EQ_INT(ctrl_config_load("/tmp", NULL, 0, reg, &cfg), CTRL_ERR_IO);
    CHECK_CONTAINS(ctrl_error_message(), "is a directory");
    ctrl_registry_destroy(reg);
}

TEST(binary_and_long_lines) {
    ctrl_registry *reg = test_registry();
    ctrl_config *cfg = NULL;
    static const char bin[] = "[run]\nseed = 1\n\x7f"
                              "ELF\x01\x00\x00garbage\n";
    const char *path = write_ini("binary.ini", bin, sizeof bin - 1);
    CHECK_EQ_INT(ctrl_config_load(path, NULL, 0, reg, &cfg), CTRL_ERR_CONFIG);
    CHECK_CONTAINS(ctrl_error_message(), "binary.ini:3");
    CHECK_CONTAINS(ctrl_error_message(), "NUL byte");
    char *long_ini = malloc(4096);
    int k = snprintf(long_ini, 4096, "[model]\npath = ");
    memset(long_ini + k, 'a', 2000);
    strcpy(long_ini + k + 2000, "\n");
    path = write_ini("long.ini", long_ini, 0);
    CHECK_EQ_INT(ctrl_config_load(path, NULL, 0, reg, &cfg), CTRL_ERR_CONFIG);
    CHECK_CONTAINS(ctrl_error_message(), "long.ini:2");
    CHECK_CONTAINS(ctrl_error_message(), "longer than");
    free(long_ini);
    ctrl_registry_destroy(reg);
}

TEST(not_a_regular_file) {
    ctrl_registry *reg = test_registry();
    ctrl_config *cfg = NULL;
    const char *p = write_ini("placeholder.ini", "x", 0);
    char fifo[600];
    snprintf(fifo, sizeof fifo, "%s.fifo", p);
    CHECK(mkfifo(fifo, 0600) == 0);
    /* Must not block on the FIFO: refused from its type alone. */
    CHECK_EQ_INT(ctrl_config_load(fifo, NULL, 0, reg, &cfg), CTRL_ERR_IO);
    CHECK_CONTAINS(ctrl_error_message(), fifo);
    CHECK_CONTAINS(ctrl_error_message(), "not a regular file");
    CHECK(cfg == NULL);
    unlink(fifo);
    ctrl_registry_destroy(reg);
}

TEST(unreadable_file) {
    if (geteuid() == 0) TEST_SKIP("running as root: permissions do not stop reads");
    ctrl_registry *reg = test_registry();
    const char *p = write_ini("secret.ini", BASE_INI, 0);
    char file[512];
    snprintf(file, sizeof file, "%s", p);
    CHECK(chmod(file, 0) == 0);
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(file, NULL, 0, reg, &cfg), CTRL_ERR_IO);
    CHECK_CONTAINS(ctrl_error_message(), file);
    CHECK_CONTAINS(ctrl_error_message(), "Permission denied");
    ctrl_registry_destroy(reg);
}

TEST(bad_arguments_do_not_crash) {
    ctrl_registry *reg = test_registry();
    ctrl_config *cfg = (ctrl_config *)1;
    CHECK_EQ_INT(ctrl_config_load(NULL, NULL, 0, reg, &cfg), CTRL_ERR_USAGE);
    CHECK(cfg == NULL);
    const char *p = write_ini("args.ini", BASE_INI, 0);
    CHECK_EQ_INT(ctrl_config_load(p, NULL, 0, NULL, &cfg), CTRL_ERR_USAGE);
    CHECK_EQ_INT(ctrl_config_load(p, NULL, 2, reg, &cfg), CTRL_ERR_USAGE);
    const char *sets[] = {NULL};
    CHECK_EQ_INT(ctrl_config_load(p, sets, 1, reg, &cfg), CTRL_ERR_CONFIG);
    CHECK_EQ_INT(ctrl_config_load(p, NULL, 0, reg, NULL), CTRL_ERR_USAGE);
    /* Accessors on a NULL config or names fall back instead of crashing. */
    CHECK(ctrl_config_get_string(NULL, "run", "seed") == NULL);
    CHECK_EQ_INT(ctrl_config_get_int(NULL, "run", "seed", 5), 5);
    CHECK(ctrl_config_where(NULL, NULL, NULL) == NULL);
    ctrl_registry_destroy(reg);
}

/* A plugin whose declared default fails its own range is refused as a plugin bug, naming it. */
static const ctrl_option t_bad_default_options[] = {
    {.key = "momentum",
     .type = CTRL_OPT_FLOAT,
     .default_value = "1.5",
     .flags = CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX,
     .min = 0,
     .max = 1,
     .doc = "m"},
    CTRL_OPTION_END,
};
T_PLUGIN(t_bad_default, CTRL_KIND_OPTIMIZER, "badopt", t_bad_default_options, &t_optimizer_ops);

TEST(plugin_with_invalid_default) {
    ctrl_registry *reg = test_registry();
    static const ctrl_plugin *const extra[] = {&t_bad_default, NULL};
    CHECK_EQ_INT(ctrl_registry_add_list(reg, extra, "<test-bad>"), CTRL_OK);
    const char *p = write_ini("baddefault.ini", BASE_INI, 0);
    const char *sets[] = {"train.optimizer=badopt"};
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(p, sets, 1, reg, &cfg), CTRL_ERR_PLUGIN);
    CHECK_CONTAINS(ctrl_error_message(), "optimizer 'badopt' declares an invalid default");
    CHECK_CONTAINS(ctrl_error_message(), "[badopt] momentum = 1.5");
    CHECK_CONTAINS(ctrl_error_message(), "out of range");
    /* Set explicitly to a valid value, the bad default is never used. */
    const char *fixed[] = {"train.optimizer=badopt", "badopt.momentum=0.5"};
    CHECK_EQ_INT(ctrl_config_load(p, fixed, 2, reg, &cfg), CTRL_OK);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

/* Random damage to a valid config (bytes replaced, inserted, lines cut) must give OK or a clear
 * error, never a crash or an empty message. Deterministic (fixed seed) so failures reproduce. */
TEST(mutated_configs_never_crash) {
    ctrl_registry *reg = test_registry();
    static const char base[] =
        "[run]\ntrainer = sft\nseed = 3\n[model]\npath = \"m\" ; q\nattention = eager\n"
        "[data]\npacking = true\nmax_length = 64\n[train]\noptimizer = adamw\n"
        "learning_rate = 1e-4\n[adamw]\nadam_beta1 = 0.9\n[reward.len]\nplugin = length\n"
        "unit = tokens\n";
    static const char alphabet[] = "[]=;#\"'\\\n\r\t .:-_aZ09\x01\x80\xff";
    uint32_t rng = 12345;
    int ok = 0, errors = 0;
    char buf[sizeof base + 16];
    for (int it = 0; it < 3000; it++) {
        memcpy(buf, base, sizeof base);
        size_t len = sizeof base - 1;
        int edits = 1 + (int)(rng % 3);
        for (int k = 0; k < edits; k++) {
            rng = rng * 1664525u + 1013904223u;
            size_t at = (rng >> 8) % len;
            char c = alphabet[(rng >> 20) % (sizeof alphabet - 1)];
            if ((rng & 3) == 0 && len + 1 < sizeof buf) { /* insert */
                memmove(buf + at + 1, buf + at, len - at);
                buf[at] = c;
                len++;
            } else if ((rng & 3) == 1 && len > 1) { /* delete */
                memmove(buf + at, buf + at + 1, len - at - 1);
                len--;
            } else {
                buf[at] = c;
            }
        }
        const char *path = write_ini("mutated.ini", buf, len);
        ctrl_config *cfg = NULL;
        ctrl_status st = ctrl_config_load(path, NULL, 0, reg, &cfg);
        if (st == CTRL_OK) {
            ok++;
            CHECK(cfg != NULL);
            ctrl_config_free(cfg);
        } else {
            errors++;
            CHECK_MSG(st == CTRL_ERR_CONFIG, "iteration %d: status %s: %s", it, ctrl_status_name(st),
                      ctrl_error_message());
            CHECK_MSG(strstr(ctrl_error_message(), "mutated.ini") != NULL, "iteration %d: no file name: %s",
                      it, ctrl_error_message());
            CHECK(cfg == NULL);
            /* These two mean the line scanner and iniparser disagreed about the syntax. */
            const char *m = ctrl_error_message();
            CHECK_MSG(!strstr(m, "iniparser could not parse") && !strstr(m, "could not read the value"),
                      "iteration %d: scanner and iniparser disagree: %s", it, m);
        }
    }
    printf("  %d accepted, %d refused\n", ok, errors);
    CHECK(ok > 0 && errors > 0);
    ctrl_registry_destroy(reg);
}

/* Every problem is reported at once, one line each, in file order (--set last), whatever order
 * the sections are checked in; past the limit the rest are counted. */
TEST(all_problems_reported_in_file_order) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("several.ini",
                                 "[reward.r]\nplugin = length\nunit = words\n" /* line 3 */
                                 "[model]\npath = m\n"
                                 "[train]\nlearning_rat = 1e-4\n" /* line 7 */
                                 "max_steps = many\n"             /* line 8 */
                                 "[adamw]\nadam_beta1 = 2\n"      /* line 10 */
                                 "[data]\npacking = perhaps\n",   /* line 12 */
                                 0);
    char file[512];
    snprintf(file, sizeof file, "%s", path);
    const char *sets[] = {"run.seed=-4"};
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(file, sets, 1, reg, &cfg), CTRL_ERR_CONFIG);
    CHECK(cfg == NULL);
    const char *msg = ctrl_error_message();
    const char *want[] = {":3: [reward.r] unit",     ":7: [train] learning_rat", ":8: [train] max_steps",
                          ":10: [adamw] adam_beta1", ":12: [data] packing",      "--set run.seed"};
    const char *prev = msg;
    for (int i = 0; i < 6; i++) {
        char w[600];
        snprintf(w, sizeof w, "%s%s", want[i][0] == ':' ? file : "", want[i]);
        const char *at = strstr(msg, w);
        CHECK_MSG(at != NULL, "missing \"%s\" in: %s", w, msg);
        CHECK_MSG(!at || at >= prev, "\"%s\" out of order in: %s", w, msg);
        if (at) prev = at;
    }
    /* One problem per line. */
    int lines = 1;
    for (const char *c = msg; *c; c++) lines += *c == '\n';
    CHECK_EQ_INT(lines, 6);

    /* Twenty unknown keys: the first ones shown, the rest counted. */
    char big[2048];
    int k = snprintf(big, sizeof big, "[model]\npath = m\n[train]\n");
    for (int i = 0; i < 20; i++) k += snprintf(big + k, sizeof big - (size_t)k, "unknown_%02d = 1\n", i);
    path = write_ini("many.ini", big, 0);
    CHECK_EQ_INT(ctrl_config_load(path, NULL, 0, reg, &cfg), CTRL_ERR_CONFIG);
    msg = ctrl_error_message();
    CHECK_CONTAINS(msg, "many.ini:4: [train] unknown_00: unknown key");
    CHECK_CONTAINS(msg, "more problems)");
    CHECK(strstr(msg, "unknown_19") == NULL);
    ctrl_registry_destroy(reg);
}

/* Loading "[model] path = m" with only the plugins of `list` fails with a config error. */
static void load_with_only(const ctrl_plugin *const *list, const char *name) {
    ctrl_registry *reg = NULL;
    CHECK_EQ_INT(ctrl_registry_create(&reg), CTRL_OK);
    CHECK_EQ_INT(ctrl_registry_add_list(reg, list, "<test-small>"), CTRL_OK);
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(write_ini(name, "[model]\npath = m\n", 0), NULL, 0, reg, &cfg),
                 CTRL_ERR_CONFIG);
    ctrl_registry_destroy(reg);
}

/* A default that names a plugin this installation lacks says so. */
TEST(default_plugin_missing) {
    static const ctrl_plugin *const list[] = {&t_sft, &t_adamw, &t_eager, NULL}; /* no flash */
    load_with_only(list, "noflash.ini");
    CHECK_CONTAINS(ctrl_error_message(), "[model] attention = 'flash' (the default)");
    CHECK_CONTAINS(ctrl_error_message(), "loaded: eager");
}

/* No plugin of a kind at all: the message says where plugins are looked for. */
TEST(no_plugin_of_a_kind_says_where_they_are_read) {
    static const ctrl_plugin *const list[] = {&t_adamw, &t_flash, NULL}; /* no trainer */
    load_with_only(list, "notrainer.ini");
    CHECK_CONTAINS(ctrl_error_message(),
                   "none loaded: plugins are read from --plugin-dir DIR, the directories of "
                   "CTRL_PLUGIN_PATH, then");
}
