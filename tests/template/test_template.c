/* Chat templates against transformers (fixtures from tests/reference/make_template_fixtures.py):
 * byte-equal renders and generation spans for the Qwen2.5, Qwen3, Llama-3.x, Mistral, SmolLM2 and
 * ChatML templates over several conversations; the interpreter's semantics on small snippets
 * rendered by the same Jinja environment; token ids and assistant masks through the real Qwen3
 * tokenizer; malformed templates fail with an error, never a crash. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "file_text.h"
#include "template/chat.h"
#include "test.h"

/* Calls fn for each JSON line of a fixture file; returns the number of lines. */
static int each_line(const char *name, void (*fn)(const cJSON *rec, void *ctx), void *ctx) {
    char path[1024];
    snprintf(path, sizeof path, "%s/templates/%s", CTRL_FIXTURE_DIR, name);
    ctrl_status st;
    char *text = ctrl_read_text_file(path, 64u << 20, &st);
    CHECK_MSG(text != NULL, "%s: %s", path, ctrl_error_message());
    if (!text) return 0;
    int n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *rec = cJSON_Parse(line);
        CHECK(rec != NULL);
        if (!rec) continue;
        fn(rec, ctx);
        cJSON_Delete(rec);
        n++;
    }
    free(text);
    return n;
}

static ctrl_template *compile_file(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/templates/%s.jinja", CTRL_FIXTURE_DIR, name);
    ctrl_status st;
    char *src = ctrl_read_text_file(path, 1 << 20, &st);
    CHECK_MSG(src != NULL, "%s: %s", path, ctrl_error_message());
    if (!src) return NULL;
    ctrl_template *t = NULL;
    st = ctrl_template_compile(src, strlen(src), path, &t);
    CHECK_MSG(st == CTRL_OK, "%s: %s", path, ctrl_error_message());
    free(src);
    return t;
}

/* The generation mask must cover exactly the fixture's spans. */
static int mask_matches(const uint8_t *mask, size_t len, const cJSON *spans) {
    uint8_t *want = calloc(len + 1, 1);
    const cJSON *s;
    cJSON_ArrayForEach(s, spans) {
        int a = cJSON_GetArrayItem(s, 0)->valueint, b = cJSON_GetArrayItem(s, 1)->valueint;
        for (int i = a; i < b && (size_t)i < len; i++) want[i] = 1;
    }
    int ok = memcmp(want, mask, len) == 0;
    free(want);
    return ok;
}

typedef struct render_stats {
    int renders, errors, with_generation;
} render_stats;

static void check_render(const cJSON *rec, void *ctx) {
    render_stats *stats = ctx;
    const char *name = cJSON_GetObjectItem(rec, "template")->valuestring;
    const char *conv = cJSON_GetObjectItem(rec, "conversation")->valuestring;
    ctrl_template *t = compile_file(name);
    if (!t) return;
    char *text = NULL;
    size_t len = 0;
    uint8_t *mask = NULL;
    ctrl_status st = ctrl_chat_render(t, cJSON_GetObjectItem(rec, "vars"), &text, &len, &mask);
    const cJSON *want = cJSON_GetObjectItem(rec, "text"), *err = cJSON_GetObjectItem(rec, "error");
    if (err) {
        CHECK_MSG(st != CTRL_OK, "%s/%s: transformers raised \"%s\" but ctrl rendered", name, conv,
                  err->valuestring);
        if (st != CTRL_OK) CHECK_CONTAINS(ctrl_error_message(), err->valuestring);
        stats->errors++;
    } else {
        CHECK_MSG(st == CTRL_OK, "%s/%s: %s", name, conv, ctrl_error_message());
        if (st == CTRL_OK) {
            CHECK_MSG(len == strlen(want->valuestring) && memcmp(text, want->valuestring, len) == 0,
                      "%s/%s differs:\n--- ctrl\n%s\n--- transformers\n%s", name, conv, text,
                      want->valuestring);
            const cJSON *spans = cJSON_GetObjectItem(rec, "generation");
            CHECK_MSG(mask_matches(mask, len, spans), "%s/%s: generation spans differ", name, conv);
            stats->with_generation += cJSON_GetArraySize(spans) > 0;
        }
        stats->renders++;
    }
    free(text);
    free(mask);
    ctrl_template_free(t);
}

TEST(model_templates_render_like_transformers) {
    render_stats stats = {0};
    int n = each_line("renders.jsonl", check_render, &stats);
    CHECK(n >= 200);
    CHECK(stats.errors >= 2);
    CHECK(stats.with_generation >= 20);
    printf("  %d renders byte-equal (%d with generation spans), %d raised errors matched\n", stats.renders,
           stats.with_generation, stats.errors);
}

static void check_snippet(const cJSON *rec, void *ctx) {
    (void)ctx;
    const char *name = cJSON_GetObjectItem(rec, "name")->valuestring;
    const char *src = cJSON_GetObjectItem(rec, "template")->valuestring;
    ctrl_template *t = NULL;
    ctrl_status st = ctrl_template_compile(src, strlen(src), name, &t);
    CHECK_MSG(st == CTRL_OK, "%s: %s", name, ctrl_error_message());
    if (st != CTRL_OK) return;
    char *text = NULL;
    size_t len = 0;
    st = ctrl_template_render(t, cJSON_GetObjectItem(rec, "vars"), &text, &len, NULL);
    const cJSON *want = cJSON_GetObjectItem(rec, "text");
    if (want) {
        CHECK_MSG(st == CTRL_OK, "%s: %s", name, ctrl_error_message());
        if (st == CTRL_OK)
            CHECK_MSG(strcmp(text, want->valuestring) == 0, "%s:\n  ctrl:   [%s]\n  jinja2: [%s]", name, text,
                      want->valuestring);
    } else {
        CHECK_MSG(st != CTRL_OK, "%s: jinja2 raised but ctrl rendered [%s]", name, text ? text : "");
        if (st != CTRL_OK) CHECK(strstr(ctrl_error_message(), name) != NULL); /* names the template */
    }
    free(text);
    ctrl_template_free(t);
}

TEST(interpreter_semantics_match_jinja) { CHECK(each_line("snippets.jsonl", check_snippet, NULL) >= 20); }

/* 64-bit edges of arithmetic, slices with huge steps, range at the ends of int64, searching, stable
 * case-insensitive sorting, tojson/indent widths (tests/reference/make_template_edge_fixtures.py). */
TEST(edge_semantics_match_jinja) { CHECK(each_line("edge_snippets.jsonl", check_snippet, NULL) >= 9); }

TEST(raise_exception_message_is_reported) {
    const char *src = "{{ raise_exception('roles must alternate') }}";
    ctrl_template *t;
    CHECK_EQ_INT(ctrl_template_compile(src, strlen(src), "t.jinja", &t), CTRL_OK);
    char *text;
    size_t len;
    cJSON *vars = cJSON_CreateObject();
    CHECK_EQ_INT(ctrl_template_render(t, vars, &text, &len, NULL), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "roles must alternate");
    CHECK_CONTAINS(ctrl_error_message(), "t.jinja");
    cJSON_Delete(vars);
    ctrl_template_free(t);
}

/* Malformed or unsupported templates are errors naming the line, never crashes. */
TEST(malformed_templates_fail_cleanly) {
    static const char *const bad[] = {
        "{% if x %}unclosed",
        "{{ x ",
        "{% for %}{% endfor %}",
        "{% endif %}",
        "{{ 'unterminated }}",
        "{# comment",
        "{{ x | }}",
        "{% set %}",
        "{% recursive %}",
        "{{ (1, }}",
        "{{ [1, 2 }}",
        "{{ x[1:2:3:4] }}",
        "{% for x in y recursive %}{% endfor %}",
        "{% macro m(%}{% endmacro %}",
        "{{ 1 +* 2 }}",
        "{% raw %}x{% endraw %}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ctrl_template *t = NULL;
        ctrl_status st = ctrl_template_compile(bad[i], strlen(bad[i]), "bad.jinja", &t);
        CHECK_MSG(st == CTRL_ERR_FORMAT, "accepted: %s", bad[i]);
        if (st == CTRL_OK)
            ctrl_template_free(t);
        else
            CHECK_CONTAINS(ctrl_error_message(), "line 1");
    }
    /* Runtime errors: unknown filters, methods, calling a non-function, iterating a number. */
    static const char *const bad_runtime[] = {
        "{{ x|nosuchfilter }}", "{{ 'a'.nosuchmethod() }}", "{{ x() }}", "{% for i in 3 %}{% endfor %}",
        "{{ 1 / 0 }}",          "{{ x is nosuchtest }}"};
    cJSON *vars = cJSON_Parse("{\"x\": 1}");
    for (size_t i = 0; i < sizeof bad_runtime / sizeof bad_runtime[0]; i++) {
        ctrl_template *t = NULL;
        CHECK_EQ_INT(ctrl_template_compile(bad_runtime[i], strlen(bad_runtime[i]), "bad.jinja", &t), CTRL_OK);
        char *text = NULL;
        size_t len;
        CHECK_MSG(ctrl_template_render(t, vars, &text, &len, NULL) == CTRL_ERR_FORMAT, "rendered: %s",
                  bad_runtime[i]);
        free(text);
        ctrl_template_free(t);
    }
    cJSON_Delete(vars);
}

typedef struct token_ctx {
    const char *name; /* which fixture lines: "qwen3" or "tiny_bpe" */
    ctrl_tokenizer *tok;
    ctrl_template *training, *own;
    int checked, masked;
} token_ctx;

static void check_tokens(const cJSON *rec, void *ctx) {
    token_ctx *c = ctx;
    if (strcmp(cJSON_GetObjectItem(rec, "tokenizer")->valuestring, c->name) != 0) return;
    cJSON *vars = cJSON_CreateObject();
    cJSON_AddItemToObject(vars, "messages", cJSON_Duplicate(cJSON_GetObjectItem(rec, "messages"), 1));
    const cJSON *agp = cJSON_GetObjectItem(rec, "add_generation_prompt");
    if (agp) cJSON_AddBoolToObject(vars, "add_generation_prompt", cJSON_IsTrue(agp));
    ctrl_chat_add_special_tokens(c->tok, vars);
    const cJSON *want_ids = cJSON_GetObjectItem(rec, "input_ids"),
                *want_mask = cJSON_GetObjectItem(rec, "assistant_masks");
    const char *conv = cJSON_GetObjectItem(rec, "conversation")->valuestring;
    int32_t *ids = NULL;
    size_t n = 0;
    uint8_t *mask = NULL;
    ctrl_status st =
        ctrl_chat_encode(c->tok, want_mask ? c->training : c->own, vars, &ids, &n, want_mask ? &mask : NULL);
    CHECK_MSG(st == CTRL_OK, "%s/%s: %s", c->name, conv, ctrl_error_message());
    if (st == CTRL_OK) {
        int same = n == (size_t)cJSON_GetArraySize(want_ids), mask_same = 1, ones = 0;
        for (size_t i = 0; same && i < n; i++) {
            same = ids[i] == cJSON_GetArrayItem(want_ids, (int)i)->valueint;
            if (want_mask)
                mask_same &= mask[i] == cJSON_GetArrayItem(want_mask, (int)i)->valueint, ones += mask[i];
        }
        CHECK_MSG(same, "%s/%s: token ids differ", c->name, conv);
        CHECK_MSG(mask_same, "%s/%s: assistant mask differs", c->name, conv);
        c->checked++;
        c->masked += ones > 0;
    }
    free(ids);
    free(mask);
    cJSON_Delete(vars);
}

static void check_tokenizer(const char *name, const char *dir, const char *training) {
    token_ctx c = {.name = name};
    CHECK_EQ_INT(ctrl_tokenizer_load(dir, &c.tok), CTRL_OK);
    if (!c.tok) return;
    c.training = compile_file(training);
    CHECK_EQ_INT(ctrl_chat_template_load(c.tok, &c.own), CTRL_OK);
    if (c.training && c.own) each_line("tokens.jsonl", check_tokens, &c);
    CHECK(c.checked >= 8);
    CHECK(c.masked >= 4); /* the masks are not all zero */
    ctrl_template_free(c.training);
    ctrl_template_free(c.own);
    ctrl_tokenizer_free(c.tok);
}

TEST(tiny_tokenizer_ids_and_assistant_masks_match_transformers) {
    check_tokenizer("tiny_bpe", CTRL_FIXTURE_DIR "/tokenizer/tiny_bpe", "qwen2_5_training");
}

TEST(qwen3_ids_and_assistant_masks_match_transformers) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/data/tokenizers/qwen3", CTRL_SHARED_DIR);
    if (access(dir, R_OK) != 0) TEST_SKIP("../shared/data/tokenizers/qwen3 is absent");
    check_tokenizer("qwen3", dir, "qwen3_training");
}
