/* include/ctrl/hugepages.h: ctrl_calloc_huge returns zeroed memory whose whole 2 MiB blocks the kernel
 * may back with transparent huge pages (their mapping's THPeligible in /proc/self/smaps), and
 * ctrl_advise_small_pages takes a range back to small pages (not eligible) without touching the rest;
 * a model's parameters and gradients are allocated so. Skipped where THP is off (for the system or this
 * process) or /proc/self/smaps says nothing of it, and under ASan (its allocator maps memory its own way). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/hugepages.h>

#include "model/model.h"
#include "model/model_config.h"
#include "test.h"

/* The THPeligible value of the mapping holding `at` (0 or 1), or -1: not found. */
static int thp_eligible(const void *at) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return -1;
    char line[512];
    int inside = 0, value = -1;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            if (inside) break; /* past the mapping, no THPeligible line in it */
            inside = (uintptr_t)at >= lo && (uintptr_t)at < hi;
        } else if (inside && sscanf(line, "THPeligible: %d", &value) == 1) {
            break;
        }
    }
    fclose(f);
    return inside ? value : -1;
}

/* THP off for the system ("never", or no THP at all) or for this process (prctl PR_SET_THP_DISABLE,
 * which some containers set: /proc/self/status says "THP_enabled: 0"). */
static int thp_off(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    char line[128] = "";
    if (!f) return 1;
    if (!fgets(line, sizeof line, f)) line[0] = 0;
    fclose(f);
    if (strstr(line, "[never]")) return 1;
    int off = 0;
    if ((f = fopen("/proc/self/status", "r"))) {
        while (fgets(line, sizeof line, f))
            if (!strncmp(line, "THP_enabled:", 12)) off = atoi(line + 12) == 0;
        fclose(f);
    }
    return off;
}

static char *block_inside(char *p) {
    return (char *)(((uintptr_t)p + CTRL_HUGE_PAGE - 1) & ~(uintptr_t)(CTRL_HUGE_PAGE - 1));
}

TEST(calloc_huge_is_zeroed_and_eligible_then_small_pages_are_not) {
    if (TEST_UNDER_ASAN) TEST_SKIP("under ASan");
    if (thp_off()) TEST_SKIP("transparent huge pages are off here");
    const size_t bytes = 16 * CTRL_HUGE_PAGE;
    char *p = ctrl_calloc_huge(bytes, 1);
    CHECK(p != NULL);
    if (!p) return;
    size_t nonzero = 0;
    for (size_t i = 0; i < bytes; i += 4096) nonzero += p[i] != 0;
    CHECK(nonzero == 0);
    char *first = block_inside(p), *small = first + 4 * CTRL_HUGE_PAGE;
    const int before = thp_eligible(first);
    if (before < 0) {
        free(p);
        TEST_SKIP("/proc/self/smaps has no THPeligible line for the buffer");
    }
    CHECK(before == 1);
    ctrl_advise_small_pages(small, 2 * CTRL_HUGE_PAGE);
    CHECK(thp_eligible(small) == 0);
    CHECK(thp_eligible(small + CTRL_HUGE_PAGE) == 0);
    CHECK(thp_eligible(first) == 1); /* the rest keeps its advice */
    CHECK(thp_eligible(small + 2 * CTRL_HUGE_PAGE) == 1);
    memset(p, 1, bytes); /* still ordinary memory throughout */
    free(p);
}

TEST(small_requests_and_null_are_left_alone) {
    char *p = ctrl_calloc_huge(100, 1); /* no whole block inside: no advice, plain calloc */
    CHECK(p != NULL && p[0] == 0 && p[99] == 0);
    free(p);
    ctrl_advise_huge_pages(NULL, 1 << 30);
    ctrl_advise_small_pages(NULL, 4096);
}

TEST(a_models_parameters_and_gradients_are_eligible) {
    if (TEST_UNDER_ASAN) TEST_SKIP("under ASan");
    if (thp_off()) TEST_SKIP("transparent huge pages are off here");
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", test_tmp_dir());
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (!f) return;
    /* 8192 x 256 embeddings and head alone: 16 MiB of each buffer */
    fprintf(f, "{\"model_type\": \"llama\", \"hidden_size\": 256, \"intermediate_size\": 512, "
               "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
               "\"vocab_size\": 8192, \"rms_norm_eps\": 1e-6, \"bos_token_id\": 1, \"eos_token_id\": 2}");
    fclose(f);
    ctrl_model_config c;
    ctrl_model *m = NULL;
    CHECK_EQ_INT(ctrl_model_config_load(path, &c), CTRL_OK);
    CHECK_EQ_INT(ctrl_model_create(&c, NULL, &m), CTRL_OK);
    if (!m) return;
    size_t np = 0, ng = 0;
    float *params = ctrl_model_params(m, &np), *grads = ctrl_model_grads(m, &ng);
    CHECK(np * sizeof(float) >= 4 * CTRL_HUGE_PAGE && ng * sizeof(float) >= 4 * CTRL_HUGE_PAGE);
    const int pe = thp_eligible(block_inside((char *)params)), ge = thp_eligible(block_inside((char *)grads));
    if (pe < 0 || ge < 0) {
        ctrl_model_free(m);
        TEST_SKIP("/proc/self/smaps has no THPeligible line for the buffers");
    }
    CHECK(pe == 1 && ge == 1);
    ctrl_model_free(m);
}
