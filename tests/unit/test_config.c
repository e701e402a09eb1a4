/* Good configs: typed values, defaults filled in, overrides applied, plugin sections, the
 * effective config round-trip, and the reference output. */
#include "config_test_support.h"
#include "test.h"

static const char *good_ini = "; a complete run\n"
                              "[run]\n"
                              "trainer = dpo\n"
                              "output_dir = /tmp/ctrl-config-test-run\n"
                              "seed = 7\n"
                              "[model]\n"
                              "path = some/model  ; inline comment\n"
                              "attention = eager\n"
                              "[data]\n"
                              "packing = yes\n"
                              "dataset_text_field = \"body # not a comment\"\n"
                              "[train]\n"
                              "optimizer = adamw\n"
                              "learning_rate = 5e-7\n"
                              "max_steps = 100\n"
                              "[memory]\n"
                              "strategies = checkpointing, offload\n"
                              "[dpo]\n"
                              "beta = 0.25\n"
                              "[adamw]\n"
                              "adam_beta1 = 0.8\n"
                              "[reward.len]\n"
                              "plugin = length\n"
                              "weight = 0.5\n"
                              "target_length = 64\n";

TEST(values_defaults_and_where) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("good.ini", good_ini, 0);
    char file[512];
    snprintf(file, sizeof file, "%s", path);
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(file, NULL, 0, reg, &cfg), CTRL_OK);
    if (!cfg) {
        printf("  %s\n", ctrl_error_message());
        return;
    }
    CHECK_STR(ctrl_config_get_string(cfg, "run", "trainer"), "dpo");
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "run", "seed", -1), 7);
    CHECK_STR(ctrl_config_get_string(cfg, "model", "path"), "some/model");
    CHECK_STR(ctrl_config_get_string(cfg, "data", "dataset_text_field"), "body # not a comment");
    CHECK(ctrl_config_get_bool(cfg, "data", "packing", false));
    CHECK_NEAR(ctrl_config_get_float(cfg, "train", "learning_rate", 0), 5e-7, 1e-20);
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "train", "max_steps", 0), 100);
    /* Defaults: core, selected plugins, reward instances. */
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "train", "gradient_accumulation_steps", 0), 1);
    CHECK_STR(ctrl_config_get_string(cfg, "train", "lr_scheduler_type"), "linear");
    CHECK_STR(ctrl_config_where(cfg, "train", "lr_scheduler_type"), "default");
    CHECK_NEAR(ctrl_config_get_float(cfg, "dpo", "beta", 0), 0.25, 1e-12);
    CHECK_NEAR(ctrl_config_get_float(cfg, "adamw", "adam_beta1", 0), 0.8, 1e-12);
    CHECK_NEAR(ctrl_config_get_float(cfg, "reward.len", "weight", 0), 0.5, 1e-12);
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "reward.len", "target_length", 0), 64);
    CHECK_STR(ctrl_config_get_string(cfg, "reward.len", "unit"), "chars");
    /* Where each value came from. */
    char want[600];
    snprintf(want, sizeof want, "%s:15", file);
    CHECK_STR(ctrl_config_where(cfg, "train", "max_steps"), want);
    CHECK(!ctrl_config_has(cfg, "train", "no_such_key"));
    CHECK(ctrl_config_get_string(cfg, "data", "train_file") == NULL); /* no default, absent */
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

TEST(overrides) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("over.ini", good_ini, 0);
    const char *sets[] = {"train.learning_rate=1e-3", "reward.len.weight=2", "TRAIN.Max_Steps=5",
                          "generation.top_k=50"};
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(path, sets, 4, reg, &cfg), CTRL_OK);
    if (!cfg) return;
    CHECK_NEAR(ctrl_config_get_float(cfg, "train", "learning_rate", 0), 1e-3, 1e-15);
    CHECK_NEAR(ctrl_config_get_float(cfg, "reward.len", "weight", 0), 2.0, 1e-15);
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "train", "max_steps", 0), 5);
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "generation", "top_k", 0), 50);
    CHECK_STR(ctrl_config_where(cfg, "train", "learning_rate"), "--set train.learning_rate");
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

TEST(default_output_dir_and_selected_plugin_defaults) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("my-run.ini", "[model]\npath = m\nattention = flash\n", 0);
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(path, NULL, 0, reg, &cfg), CTRL_OK);
    if (!cfg) return;
    CHECK_STR(ctrl_config_get_string(cfg, "run", "output_dir"), "runs/my-run");
    CHECK_STR(ctrl_config_get_string(cfg, "run", "trainer"), "sft");
    CHECK_EQ_INT(ctrl_config_get_int(cfg, "attention.flash", "block_q", 0), 64);
    CHECK_NEAR(ctrl_config_get_float(cfg, "adamw", "adam_beta1", 0), 0.9, 1e-12);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

TEST(effective_config_round_trip) {
    ctrl_registry *reg = test_registry();
    const char *path = write_ini("round.ini", good_ini, 0);
    char file[512];
    snprintf(file, sizeof file, "%s", path);
    const char *sets[] = {"train.learning_rate=1e-3"};
    ctrl_config *a = NULL, *b = NULL;
    CHECK_EQ_INT(ctrl_config_load(file, sets, 1, reg, &a), CTRL_OK);
    if (!a) return;
    char out[600];
    snprintf(out, sizeof out, "%s.effective.ini", file);
    CHECK_EQ_INT(ctrl_config_write_effective(a, out), CTRL_OK);
    CHECK_EQ_INT(ctrl_config_load(out, NULL, 0, reg, &b), CTRL_OK);
    if (!b) {
        printf("  reload: %s\n", ctrl_error_message());
        ctrl_config_free(a);
        return;
    }
    static const char *const keys[][2] = {
        {"run", "trainer"},
        {"run", "seed"},
        {"model", "path"},
        {"data", "packing"},
        {"data", "dataset_text_field"},
        {"train", "learning_rate"},
        {"train", "max_steps"},
        {"train", "weight_decay"},
        {"memory", "strategies"},
        {"dpo", "beta"},
        {"adamw", "adam_beta1"},
        {"reward.len", "plugin"},
        {"reward.len", "unit"},
        {"generation", "mode"},
        {"peft", "target_modules"},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        CHECK_STR(ctrl_config_get_string(b, keys[i][0], keys[i][1]),
                  ctrl_config_get_string(a, keys[i][0], keys[i][1]));
    ctrl_config_free(a);
    ctrl_config_free(b);
    ctrl_registry_destroy(reg);
}

TEST(reference_and_describe) {
    ctrl_registry *reg = test_registry();
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK_EQ_INT(ctrl_config_reference_write(reg, f), CTRL_OK);
    fclose(f);
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++) {
        char h[64];
        snprintf(h, sizeof h, "### [%s]", s->name);
        CHECK_CONTAINS(buf, h);
    }
    CHECK_CONTAINS(buf, "| `learning_rate` | float | `2e-5` | > 0 |");
    CHECK_CONTAINS(buf, "### trainer/dpo — section `[dpo]`");
    CHECK_CONTAINS(buf, "### attention/flash — section `[attention.flash]`");
    CHECK_CONTAINS(buf, "### reward/length — in `[reward.NAME]` with `plugin = length`");
    free(buf);
    buf = NULL;
    f = open_memstream(&buf, &len);
    ctrl_option_table_print(f, t_length_options);
    fclose(f);
    CHECK_CONTAINS(buf, "target_length");
    CHECK_CONTAINS(buf, "chars|tokens");
    free(buf);
    ctrl_registry_destroy(reg);
}
