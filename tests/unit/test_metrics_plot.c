/* The training-curve PNG (core/train/metrics_plot.c) for every trainer's set of metrics: a panel's
 * series the run did not log is left out, since gnuplot fails the whole plot on a series with no
 * valid point (KTO logs no entropy or accuracy: its plot used to fail though most of it was drawn). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"
#include "train/metrics_plot.h"

/* Writes `lines` to a fresh metrics.jsonl, plots it, and checks a PNG came out. */
static void plot_case(const char *name, const char *lines) {
    char dir[] = "/tmp/ctrl_plot_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char jsonl[256], png[256];
    snprintf(jsonl, sizeof jsonl, "%s/metrics.jsonl", dir);
    snprintf(png, sizeof png, "%s/metrics.png", dir);
    FILE *f = fopen(jsonl, "w");
    CHECK(f != NULL);
    fputs(lines, f);
    fclose(f);
    const ctrl_status st = ctrl_metrics_plot(jsonl, png);
    CHECK_MSG(st == CTRL_OK, "%s: %s", name, st == CTRL_OK ? "" : ctrl_error_message());
    unsigned char magic[4] = {0};
    f = fopen(png, "rb");
    CHECK_MSG(f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "\x89PNG", 4), "%s: no PNG written", name);
    if (f) fclose(f);
    remove(png), remove(jsonl), rmdir(dir);
}

static int have_gnuplot(void) { return system("command -v gnuplot >/dev/null 2>&1") == 0; }

TEST(sft_metrics_plot) {
    if (!have_gnuplot()) TEST_SKIP("gnuplot is not installed");
    plot_case("sft", "{\"step\": 1, \"loss\": 2.5, \"grad_norm\": 1.2, \"learning_rate\": 1e-4, "
                     "\"entropy\": 3.1, \"mean_token_accuracy\": 0.2}\n"
                     "{\"step\": 2, \"loss\": 2.1, \"grad_norm\": 1.0, \"learning_rate\": 5e-5, "
                     "\"entropy\": 2.9, \"mean_token_accuracy\": 0.3}\n");
}

TEST(kto_metrics_without_entropy_or_accuracy_plot) {
    if (!have_gnuplot()) TEST_SKIP("gnuplot is not installed");
    plot_case("kto", "{\"step\": 1, \"loss\": 0.69, \"grad_norm\": 0.5, \"learning_rate\": 1e-4, "
                     "\"rewards/margins\": 0.0}\n"
                     "{\"step\": 2, \"loss\": 0.6, \"grad_norm\": 0.4, \"learning_rate\": 5e-5, "
                     "\"rewards/margins\": 0.1}\n");
}

TEST(online_metrics_plot_the_reward) {
    if (!have_gnuplot()) TEST_SKIP("gnuplot is not installed");
    plot_case(
        "grpo",
        "{\"step\": 1, \"loss\": 0.0, \"grad_norm\": 0.1, \"learning_rate\": 1e-6, \"reward\": 0.3}\n"
        "{\"step\": 2, \"loss\": 0.01, \"grad_norm\": 0.2, \"learning_rate\": 1e-6, \"reward\": 0.5}\n");
}
