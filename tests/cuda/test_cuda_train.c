/* SFT trained on a GPU (`[run] device = cuda`: the model's forward and backward on the device, the
 * optimizer on the host) against TRL's curves: every case of tests/e2e/test_trl_parity.c, with the
 * same tolerances. Skips, saying why, where no GPU can be used. Under the CUDA emulator
 * (test_cuda_train_emu, CTRL_TEST_SMALL) only the cases that differ on the device run: padded and
 * padding-free attention, bf16, gradient accumulation, packed rows. */
#define TRL_PARITY_DEVICE "cuda"
#define TRL_PARITY_SMALL_CASES " padded padded_bf16 padding_free grad_accum bfd_packing "
#include "../e2e/test_trl_parity.c"

/* Checkpointing on the device: the padded case saves checkpoint-10 on the device (the parameters
 * the device's optimizer stepped, its exp_avg/exp_avg_sq brought to the host), then a second run
 * resumes from it; its steps 11-20 must be the uninterrupted run's. Both the weights and the
 * optimizer state have to round-trip for that: zeroed moments or stale host weights change the
 * curve at the first resumed step. */
static cJSON *metrics_line(const char *text, int step) {
    char key[32];
    snprintf(key, sizeof key, "\"step\": %d,", step);
    const char *p = strstr(text, key);
    if (!p) return NULL;
    while (p > text && p[-1] != '\n') p--;
    const char *e = strchr(p, '\n');
    char *line = strndup(p, e ? (size_t)(e - p) : strlen(p));
    cJSON *o = cJSON_Parse(line);
    free(line);
    return o;
}

static ctrl_status train_with(const char *ini, const char **sets, int n) {
    ctrl_registry *reg = test_plugin_registry();
    ctrl_config *cfg = NULL;
    ctrl_status st = ctrl_config_load(ini, sets, n, reg, &cfg);
    if (st == CTRL_OK) st = ctrl_train_run(cfg, NULL);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
    return st;
}

TEST(resume_on_device) {
    const char *tmp = test_tmp_dir();
    if (!tmp) TEST_SKIP("no temporary directory");
    ctrl_device dev;
    const ctrl_cuda_backend *cuda;
    if (ctrl_device_select(TRL_PARITY_DEVICE, &dev, &cuda) != CTRL_OK) TEST_SKIP(ctrl_error_message());
    char ini[1200], out[1200], resumed[1300], ckpt[1400], o1[1400], o2[1400], r1[1500], path[1600];
    CHECK(write_ini("padded", ini, sizeof ini, out, sizeof out) == 0);
    snprintf(resumed, sizeof resumed, "%s-resumed", out);
    snprintf(ckpt, sizeof ckpt, "train.resume_from_checkpoint=%s/checkpoint-10", out);
    snprintf(o1, sizeof o1, "run.output_dir=%s", out);
    snprintf(o2, sizeof o2, "run.output_dir=%s", resumed);
    mkdir(out, 0755), mkdir(resumed, 0755);
    const char *full[] = {"run.device=" TRL_PARITY_DEVICE, "train.save_steps=10", o1};
    ctrl_status st = train_with(ini, full, 3);
    CHECK_MSG(st == CTRL_OK, "full run: %s", ctrl_error_message());
    snprintf(r1, sizeof r1, "%s", ckpt);
    const char *again[] = {"run.device=" TRL_PARITY_DEVICE, "train.save_steps=10", o2, r1};
    if (st == CTRL_OK) st = train_with(ini, again, 4);
    CHECK_MSG(st == CTRL_OK, "resumed run: %s", ctrl_error_message());
    if (st != CTRL_OK) return;
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    char *a = ctrl_read_text_file(path, 1 << 20, &st);
    snprintf(path, sizeof path, "%s/metrics.jsonl", resumed);
    char *b = ctrl_read_text_file(path, 1 << 20, &st);
    CHECK(a && b);
    double worst = 0;
    for (int step = 11; a && b && step <= 20; step++) {
        cJSON *x = metrics_line(a, step), *y = metrics_line(b, step);
        CHECK_MSG(x && y, "step %d missing", step);
        if (x && y)
            for (const char *k = "loss"; k; k = !strcmp(k, "loss") ? "grad_norm" : NULL) {
                double e =
                    rel(cJSON_GetObjectItem(y, k)->valuedouble, cJSON_GetObjectItem(x, k)->valuedouble);
                worst = fmax(worst, e);
                CHECK_MSG(e <= 1e-5, "step %d %s: resumed %.7g, uninterrupted %.7g", step, k,
                          cJSON_GetObjectItem(y, k)->valuedouble, cJSON_GetObjectItem(x, k)->valuedouble);
            }
        cJSON_Delete(x), cJSON_Delete(y);
    }
    printf("  resumed from checkpoint-10 on %s: steps 11-20 within %.2g of the uninterrupted run\n",
           TRL_PARITY_DEVICE, worst);
    free(a), free(b);
}
