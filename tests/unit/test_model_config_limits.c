/* config.json as untrusted input (issue 15): every shape field an integral number within a named
 * limit, floats finite and in range, the shape's products bounded in 64 bits, and a model too large
 * for the machine refused before anything is allocated (its error path once read the freed model).
 * Each case is a minimal hand-written config; the error must name the file, the key and the limit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/model.h"
#include "model/model_config.h"
#include "test.h"

/* A small valid Llama config; the overrides come first (cJSON finds the first of duplicate keys). */
static const char *write_config(const char *name, const char *overrides) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s.json", test_tmp_dir(), name);
    FILE *f = fopen(path, "w");
    fprintf(f,
            "{%s%s\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 96, "
            "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
            "\"vocab_size\": 128, \"rms_norm_eps\": 1e-6, \"bos_token_id\": 1, \"eos_token_id\": 2}",
            overrides, *overrides ? ", " : "");
    fclose(f);
    return path;
}

static void expect_refused(const char *name, const char *overrides, const char *needle) {
    const char *path = write_config(name, overrides);
    ctrl_model_config c;
    ctrl_status s = ctrl_model_config_load(path, &c);
    CHECK_MSG(s != CTRL_OK, "%s: accepted", overrides);
    CHECK_CONTAINS(ctrl_error_message(), name);
    CHECK_CONTAINS(ctrl_error_message(), needle);
}

TEST(the_base_config_loads) {
    ctrl_model_config c;
    CHECK_EQ_INT(ctrl_model_config_load(write_config("base", ""), &c), CTRL_OK);
    CHECK_EQ_INT(c.head_dim, 16);
    CHECK_EQ_INT(c.eos_token_id, 2);
    CHECK_EQ_INT(ctrl_model_config_param_count(&c),
                 2 * 128 * 64 + 64 + 2 * (2 * 64 + 64 * 64 * 2 + 2 * 32 * 64 + 3 * 96 * 64));
    /* nulls are absent, as transformers writes them */
    CHECK_EQ_INT(ctrl_model_config_load(write_config("nulls", "\"head_dim\": null, \"sliding_window\": null, "
                                                              "\"bos_token_id\": null"),
                                        &c),
                 CTRL_OK);
    CHECK_EQ_INT(c.bos_token_id, -1);
}

TEST(shape_fields_must_be_integers_within_limits) {
    expect_refused("frac_hidden", "\"hidden_size\": 64.5", "hidden_size = 64.5 is not an integer");
    expect_refused("huge_hidden", "\"hidden_size\": 1e9", "hidden_size = 1000000000 exceeds the limit 65536");
    expect_refused("huge_layers", "\"num_hidden_layers\": 2e8",
                   "num_hidden_layers = 200000000 exceeds the limit 1024");
    expect_refused("zero_layers", "\"num_hidden_layers\": 0", "num_hidden_layers = 0 is below the minimum 1");
    expect_refused("huge_heads", "\"num_attention_heads\": 2147483648",
                   "num_attention_heads = 2147483648 exceeds the limit 1024");
    expect_refused("huge_head_dim", "\"head_dim\": 1073741824",
                   "head_dim = 1073741824 exceeds the limit 1024");
    expect_refused("odd_head_dim", "\"head_dim\": 15", "head_dim = 15 must be even");
    expect_refused("kv_heads", "\"num_key_value_heads\": 3", "not a multiple of num_key_value_heads (3)");
    expect_refused("more_kv_heads", "\"num_key_value_heads\": 8",
                   "num_key_value_heads = 8 exceeds the limit 4");
    expect_refused("ragged_heads", "\"num_attention_heads\": 3, \"num_key_value_heads\": 3",
                   "hidden_size (64) is not a multiple of num_attention_heads (3)");
    expect_refused("huge_vocab", "\"vocab_size\": 1e12",
                   "vocab_size = 1000000000000 exceeds the limit 16777216");
    expect_refused("neg_inter", "\"intermediate_size\": -96",
                   "intermediate_size = -96 is below the minimum 1");
    expect_refused("str_positions", "\"max_position_embeddings\": \"4096\"",
                   "max_position_embeddings must be an integer");
    expect_refused("huge_positions", "\"max_position_embeddings\": 1e300",
                   "max_position_embeddings = 1.0000000000000001e+300 exceeds");
    expect_refused("huge_window", "\"use_sliding_window\": true, \"sliding_window\": 1e10",
                   "sliding_window = 10000000000 exceeds");
    expect_refused("eos_out_of_vocab", "\"eos_token_id\": [128]", "eos_token_id = 128 exceeds the limit 127");
    expect_refused("neg_bos", "\"bos_token_id\": -5", "bos_token_id = -5 is below the minimum 0");
}

TEST(floats_must_be_finite_and_positive) {
    expect_refused("neg_eps", "\"rms_norm_eps\": -1e-6",
                   "rms_norm_eps = -9.9999999999999995e-07 must be > 0");
    expect_refused("tiny_eps", "\"rms_norm_eps\": 1e-60",
                   "rms_norm_eps = 1e-60 is not a positive fp32 number");
    expect_refused("inf_eps", "\"rms_norm_eps\": 1e999", "rms_norm_eps must be a finite number");
    expect_refused("zero_theta", "\"rope_theta\": 0", "rope_theta = 0 must be > 0");
    expect_refused("inf_factor", "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 1e999}",
                   "factor must be a finite number");
    expect_refused("neg_factor", "\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": -2}",
                   "factor = -2 must be > 0");
    expect_refused("llama3_ramp",
                   "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, "
                   "\"high_freq_factor\": 4}",
                   "high_freq_factor (4) must exceed low_freq_factor (4)");
    expect_refused("yarn_theta",
                   "\"rope_theta\": 1, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}",
                   "yarn rope needs rope_theta > 1");
}

TEST(parameter_count_is_bounded_before_allocating) {
    /* each field within its limit, their product not: 2^24 × 2^16 × 2 embeddings > 2^40 */
    expect_refused("huge_product", "\"hidden_size\": 65536, \"vocab_size\": 16777216",
                   "parameters, more than the limit 1099511627776");
}

TEST(model_too_large_for_memory_is_refused_before_allocating) {
    /* 2^24 × 2^14 × 2 ≈ 5.5e11 parameters: 2 TiB of weights, more than a test machine has. Before,
     * the allocation failed and the error path read the model it had just freed. */
    if ((double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) > 1.5 * (1ull << 40))
        TEST_SKIP("this machine could hold 2 TiB of weights");
    ctrl_model_config c;
    CHECK_EQ_INT(
        ctrl_model_config_load(write_config("big", "\"hidden_size\": 16384, \"vocab_size\": 16777216"), &c),
        CTRL_OK);
    ctrl_model *m = (ctrl_model *)1;
    ctrl_status s = ctrl_model_create(&c, NULL, &m);
    CHECK_EQ_INT(s, CTRL_ERR_NOMEM);
    CHECK(m == NULL);
    CHECK_CONTAINS(ctrl_error_message(), "parameters need");
    CHECK_CONTAINS(ctrl_error_message(), "GiB of fp32 weights, more than this machine's");
}
