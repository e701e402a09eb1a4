/* The generation fixtures (tests/reference/make_generation_fixtures.py writes
 * fixtures/generation/<arch>.json): two prompts and transformers' first 12 greedy tokens for each,
 * read by the engine tests on the CPU (tests/unit/test_engine.c) and on the device
 * (tests/cuda/test_cuda_online.c). Header-only: every test target has tests/ and cJSON. */
#ifndef CTRL_TEST_GEN_CASE_H
#define CTRL_TEST_GEN_CASE_H

#include <stdint.h>
#include <stdio.h>

#include "model/json_file.h"

enum { GEN_CASE_MAX_PROMPT = 64, GEN_CASE_TOKENS = 12 };

typedef struct gen_case {
    int32_t prompt[GEN_CASE_MAX_PROMPT], want[GEN_CASE_TOKENS];
    int len;
} gen_case;

/* cases[0..1] from generation/<arch>.json (a test failure when it cannot be read). */
static inline void gen_cases_read(const char *arch, gen_case *cases) {
    char path[512];
    snprintf(path, sizeof path, CTRL_FIXTURE_DIR "/generation/%s.json", arch);
    cJSON *all = json_file(path);
    for (int c = 0; c < 2 && all; c++) {
        const cJSON *o = cJSON_GetArrayItem(all, c), *p = cJSON_GetObjectItem(o, "prompt");
        cases[c].len = cJSON_GetArraySize(p);
        for (int i = 0; i < cases[c].len && i < GEN_CASE_MAX_PROMPT; i++)
            cases[c].prompt[i] = cJSON_GetArrayItem(p, i)->valueint;
        for (int i = 0; i < GEN_CASE_TOKENS; i++)
            cases[c].want[i] = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "generated"), i)->valueint;
    }
    cJSON_Delete(all);
}

#endif
