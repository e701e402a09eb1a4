/* Bad configs: each case must fail with the right status and a message naming the file, the
 * line (where there is one), the key, and a suggestion where one fits. Nothing may crash. */
#include "config_test_support.h"
#include "test.h"

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
