/* ctrl generate --model DIR --prompts FILE.jsonl [--chat] [--n N] [--max-tokens N] [--temperature T]
 *               [--top-p P] [--top-k K] [--min-p P] [--repetition-penalty R] [--seed S]
 *               [--kv-cache-mb N] [--kv-cache-dtype fp32|bf16] [--dtype fp32|bf16] [--decode-threads N]
 *               --out FILE.jsonl */
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "clock.h"
#include "file_text.h"
#include "hub_cache.h"
#include "generate/engine.h"
#include "model/peft.h"
#include "progress.h"
#include "template/chat.h"
#include "tokenizer/tokenizer.h"

typedef struct gen_args {
    const char *model, *prompts, *out, *adapter;
    const char *stop[8];
    int n_stop_strings;
    int chat, n, max_tokens, top_k;
    float temperature, top_p, min_p, repetition_penalty;
    long seed, kv_mb;
    int kv_bf16;        /* -1: as the compute dtype */
    int bf16;           /* --dtype bf16: the linear layers compute in bf16 */
    int decode_threads; /* 0: every thread ([generation] decode_threads) */
} gen_args;

static int parse(int argc, char **argv, gen_args *a) {
    *a = (gen_args){.n = 1,
                    .max_tokens = 64,
                    .temperature = 1.0f,
                    .top_p = 1.0f,
                    .repetition_penalty = 1.0f,
                    .kv_mb = 256,
                    .kv_bf16 = -1};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--chat")) {
            a->chat = 1;
            continue;
        }
        if (!v) return cli_usage_error(&cli_cmd_generate, "%s needs a value", k);
        i++;
        char *end = NULL;
        double num = strtod(v, &end);
        const int is_num = end && *end == 0;
        if (!strcmp(k, "--stop")) {
            if (a->n_stop_strings == 8) return cli_usage_error(&cli_cmd_generate, "at most 8 --stop strings");
            if (!v[0]) return cli_usage_error(&cli_cmd_generate, "--stop needs a non-empty string");
            a->stop[a->n_stop_strings++] = v;
        } else if (!strcmp(k, "--model")) {
            static char resolved[4096]; /* a Hub id: the local cache's snapshot */
            a->model = ctrl_hub_resolve(v, resolved, sizeof resolved);
        } else if (!strcmp(k, "--adapter"))
            a->adapter = v;
        else if (!strcmp(k, "--prompts"))
            a->prompts = v;
        else if (!strcmp(k, "--out"))
            a->out = v;
        else if (!strcmp(k, "--kv-cache-dtype") && (!strcmp(v, "fp32") || !strcmp(v, "bf16")))
            a->kv_bf16 = !strcmp(v, "bf16");
        else if (!strcmp(k, "--kv-cache-dtype"))
            return cli_usage_error(&cli_cmd_generate, "--kv-cache-dtype %s: fp32 or bf16", v);
        else if (!strcmp(k, "--dtype") && (!strcmp(v, "fp32") || !strcmp(v, "bf16")))
            a->bf16 = !strcmp(v, "bf16");
        else if (!strcmp(k, "--dtype"))
            return cli_usage_error(&cli_cmd_generate, "--dtype %s: fp32 or bf16", v);
        else if (!is_num)
            return cli_usage_error(&cli_cmd_generate, "%s %s: not a number (or an unknown option)", k, v);
        else if (!strcmp(k, "--n"))
            a->n = (int)num;
        else if (!strcmp(k, "--max-tokens"))
            a->max_tokens = (int)num;
        else if (!strcmp(k, "--temperature"))
            a->temperature = (float)num;
        else if (!strcmp(k, "--top-p"))
            a->top_p = (float)num;
        else if (!strcmp(k, "--top-k"))
            a->top_k = (int)num;
        else if (!strcmp(k, "--min-p"))
            a->min_p = (float)num;
        else if (!strcmp(k, "--repetition-penalty"))
            a->repetition_penalty = (float)num;
        else if (!strcmp(k, "--seed"))
            a->seed = (long)num;
        else if (!strcmp(k, "--kv-cache-mb"))
            a->kv_mb = (long)num;
        else if (!strcmp(k, "--decode-threads") && num >= 0 && num <= 4096 && num == (int)num)
            a->decode_threads = (int)num;
        else if (!strcmp(k, "--decode-threads"))
            return cli_usage_error(&cli_cmd_generate,
                                   "--decode-threads %s: 0 (every thread) or a thread count", v);
        else
            return cli_usage_error(&cli_cmd_generate, "unexpected argument '%s'", k);
    }
    if (!a->model || !a->prompts || !a->out)
        return cli_usage_error(&cli_cmd_generate,
                               "needs --model DIR, --prompts FILE.jsonl and --out FILE.jsonl");
    if (a->n < 1 || a->max_tokens < 1 || a->kv_mb < 1 || a->temperature < 0 || a->top_p <= 0 ||
        a->top_p > 1 || a->min_p < 0 || a->min_p > 1 || a->repetition_penalty <= 0)
        return cli_usage_error(&cli_cmd_generate,
                               "out-of-range value: n, max-tokens, kv-cache-mb >= 1; temperature "
                               ">= 0; 0 < top-p <= 1; 0 <= min-p <= 1; repetition-penalty > 0");
    return 0;
}

/* Stop strings: the completion so far is decoded and searched (vLLM's stop; the text written is cut
 * before the stop string, as vLLM does unless include_stop_str_in_output). */
typedef struct stop_strings {
    const ctrl_tokenizer *tok;
    const gen_args *a;
} stop_strings;

static const char *find_stop(const gen_args *a, const char *text) {
    const char *first = NULL;
    for (int i = 0; i < a->n_stop_strings; i++) {
        const char *hit = strstr(text, a->stop[i]);
        if (hit && (!first || hit < first)) first = hit;
    }
    return first;
}

/* Called after every drawn token: only a match that ends in the new token's text is new, so only
 * the completion's tail is decoded — enough tokens for the longest stop string plus a few, since a
 * token may be a fragment of a UTF-8 character. */
static int stop_check(void *ctx, const int32_t *ids, int len) {
    const stop_strings *s = ctx;
    size_t need = 0;
    for (int i = 0; i < s->a->n_stop_strings; i++)
        if (strlen(s->a->stop[i]) > need) need = strlen(s->a->stop[i]);
    need += 16;
    int from = len;
    char *text = NULL;
    size_t n = 0;
    do {
        from = from > 8 ? from - 8 : 0;
        free(text), text = NULL;
        if (ctrl_tokenizer_decode(s->tok, ids + from, (size_t)(len - from), 1, &text, &n) != CTRL_OK)
            return 0;
    } while (from > 0 && n < need);
    const int hit = find_stop(s->a, text) != NULL;
    free(text);
    return hit;
}

typedef struct progress_ctx {
    ctrl_progress bar;
    long max_tokens; /* every sample running to max_tokens: the bar's end */
} progress_ctx;

static void show_progress(long generated, void *ctx) {
    progress_ctx *p = ctx;
    ctrl_progress_update(&p->bar, generated, p->max_tokens, (double)generated, "tokens", NULL);
}

/* One prompt line to token ids: {"prompt": text} (special tokens added, as vLLM), or with --chat
 * {"messages": [...]} through the chat template with the generation prompt. */
static ctrl_status prompt_ids(const ctrl_tokenizer *tok, const ctrl_template *tpl, cJSON *line, int32_t **ids,
                              size_t *n) {
    if (tpl) {
        if (!cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(line, "messages")))
            return ctrl_error_set(CTRL_ERR_FORMAT, "expected {\"messages\": [...]} (--chat)");
        cJSON_DeleteItemFromObjectCaseSensitive(line, "add_generation_prompt");
        cJSON_AddTrueToObject(line, "add_generation_prompt");
        ctrl_chat_add_special_tokens(tok, line);
        return ctrl_chat_encode(tok, tpl, line, ids, n, NULL);
    }
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(line, "prompt");
    if (!cJSON_IsString(p)) return ctrl_error_set(CTRL_ERR_FORMAT, "expected {\"prompt\": \"...\"}");
    return ctrl_tokenizer_encode(tok, p->valuestring, strlen(p->valuestring), 1, ids, n);
}

/* Nothing trains here: with bf16 compute the weights are packed into the GEMM's panels once, before
 * the first step, and their fp32 copies given back; where that cannot be, decoding packs them itself
 * as it first multiplies by them, as a trainer's does. */
static ctrl_status hold_panels(ctrl_model *m) {
    ctrl_status st = ctrl_model_base_in_panels(m) ? CTRL_OK : ctrl_model_hold_panels(m); /* (as it loaded) */
    char held[256];
    ctrl_model_held_summary(m, held, sizeof held);
    if (st == CTRL_OK)
        CTRL_INFO("generate: the weights held as bf16 GEMM panels before the first step (%s)", held);
    if (st != CTRL_ERR_UNSUPPORTED) return st;
    CTRL_INFO("generate: weights packed for bf16 as decoding first multiplies by them (%s)",
              ctrl_error_message());
    ctrl_error_clear();
    return CTRL_OK;
}

static int run_generate(ctrl_cli *cli, int argc, char **argv) {
    gen_args a;
    int rc = parse(argc, argv, &a);
    if (rc) return rc;
    ctrl_model *m = NULL;
    ctrl_tokenizer *tok = NULL;
    ctrl_template *tpl = NULL;
    ctrl_engine *eng = NULL;
    /* with --adapter the base under a PEFT LoRA adapter, applied live in every step (no merge) */
    /* with bf16 held as it loads: layer by layer, the fp32 model never whole */
    ctrl_status st = a.adapter ? (a.bf16 ? ctrl_peft_load_bf16 : ctrl_peft_load)(a.model, a.adapter, NULL, &m)
                     : a.bf16  ? ctrl_model_load_frozen_bf16(a.model, NULL, &m)
                               : ctrl_model_load(a.model, NULL, &m);
    if (st == CTRL_OK && a.bf16) st = hold_panels(m);
    if (st == CTRL_OK) st = ctrl_tokenizer_load(a.model, &tok);
    if (st == CTRL_OK && a.chat) st = ctrl_chat_template_load(tok, &tpl);
    /* read and tokenize every prompt */
    cJSON **lines = NULL;
    ctrl_gen_request *reqs = NULL;
    int n_req = 0, cap = 0;
    char *text = st == CTRL_OK ? ctrl_read_text_file(a.prompts, 1u << 30, &st) : NULL, *save;
    int32_t stops[16];
    stop_strings ss = {tok, &a};
    const int n_stop = tok ? ctrl_generation_stop_ids(a.model, tok, stops, 16) : 0;
    int lineno = 0;
    for (char *l = text ? strtok_r(text, "\n", &save) : NULL; l && st == CTRL_OK;
         l = strtok_r(NULL, "\n", &save)) {
        lineno++;
        if (l[strspn(l, " \t\r")] == 0) continue;
        if (n_req == cap) {
            const int grown = cap ? 2 * cap : 64;
            cJSON **nl = realloc(lines, sizeof *lines * (size_t)grown);
            if (nl) lines = nl;
            ctrl_gen_request *nr = nl ? realloc(reqs, sizeof *reqs * (size_t)grown) : NULL;
            if (nr) reqs = nr;
            if (!nl || !nr) {
                st = ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory at line %d", a.prompts, lineno);
                break;
            }
            cap = grown;
        }
        cJSON *o = cJSON_Parse(l);
        int32_t *ids = NULL;
        size_t n = 0;
        st = o ? prompt_ids(tok, tpl, o, &ids, &n) : ctrl_error_set(CTRL_ERR_FORMAT, "not valid JSON");
        if (st == CTRL_OK && n == 0) st = ctrl_error_set(CTRL_ERR_FORMAT, "the prompt is empty");
        if (st != CTRL_OK) {
            ctrl_error_wrap(st, "%s:%d", a.prompts, lineno);
            cJSON_Delete(o), free(ids);
            break;
        }
        lines[n_req] = o;
        reqs[n_req++] =
            (ctrl_gen_request){.prompt = ids,
                               .prompt_len = (int)n,
                               .n = a.n,
                               .max_tokens = a.max_tokens,
                               .sampling = {a.temperature, a.top_k, a.top_p, a.min_p, a.repetition_penalty},
                               .seed = (uint64_t)a.seed + (uint64_t)lineno,
                               .stop_ids = stops,
                               .n_stop = n_stop,
                               .stop_check = a.n_stop_strings ? stop_check : NULL,
                               .stop_ctx = &ss};
    }
    free(text);
    ctrl_gen_output *outs = calloc((size_t)(n_req ? n_req : 1) * (size_t)a.n, sizeof *outs);
    if (!outs && st == CTRL_OK) st = ctrl_error_set(CTRL_ERR_NOMEM, "generate: out of memory for outputs");
    const ctrl_engine_config ec = {.kv_cache_bytes = (size_t)a.kv_mb << 20,
                                   .block_size = 16,
                                   .max_num_seqs = 256,
                                   .max_num_batched_tokens = 2048,
                                   .kv_cache_dtype = a.kv_bf16,
                                   .decode_threads = a.decode_threads};
    ctrl_registry *reg = NULL;
    if (st == CTRL_OK) st = cli_plugins(cli, &reg);
    const ctrl_plugin *paged = NULL;
    if (st == CTRL_OK) st = ctrl_registry_require(reg, CTRL_KIND_ATTENTION, "paged", &paged);
    if (st == CTRL_OK) st = ctrl_engine_attach_attention(m, paged);
    if (st == CTRL_OK) st = ctrl_engine_create(m, &ec, &eng);
    const double t0 = ctrl_now(), cpu0 = ctrl_clock_seconds(CLOCK_PROCESS_CPUTIME_ID);
    progress_ctx prog = {.max_tokens = (long)n_req * a.n * a.max_tokens};
    ctrl_progress_start(&prog.bar, "tokens", 5.0);
    if (st == CTRL_OK) st = ctrl_engine_generate(eng, reqs, n_req, outs, show_progress, &prog);
    ctrl_progress_end(&prog.bar);
    FILE *f = st == CTRL_OK ? fopen(a.out, "w") : NULL;
    if (st == CTRL_OK && !f) st = ctrl_error_set(CTRL_ERR_IO, "%s: %s", a.out, strerror(errno));
    long total = 0;
    for (int r = 0; st == CTRL_OK && r < n_req; r++) {
        cJSON *comps = cJSON_AddArrayToObject(lines[r], "completions");
        for (int k = 0; k < a.n; k++) {
            const ctrl_gen_output *o = &outs[(size_t)r * a.n + k];
            char *txt = NULL;
            size_t len;
            if ((st = ctrl_tokenizer_decode(tok, o->ids, (size_t)o->len, 1, &txt, &len)) != CTRL_OK) break;
            cJSON *c = cJSON_CreateObject();
            char *cut = (char *)find_stop(&a, txt);
            if (cut) *cut = 0;
            cJSON_AddStringToObject(c, "text", txt);
            cJSON *ids = cJSON_AddArrayToObject(c, "token_ids"), *lps = cJSON_AddArrayToObject(c, "logprobs");
            for (int i = 0; i < o->len; i++) {
                cJSON_AddItemToArray(ids, cJSON_CreateNumber(o->ids[i]));
                cJSON_AddItemToArray(lps, cJSON_CreateNumber(o->logprobs[i]));
            }
            cJSON_AddStringToObject(c, "finish_reason", o->stopped ? "stop" : "length");
            cJSON_AddItemToArray(comps, c);
            free(txt);
            total += o->len;
        }
        char *s = cJSON_PrintUnformatted(lines[r]);
        fprintf(f, "%s\n", s);
        cJSON_free(s);
    }
    if (f && fclose(f) != 0 && st == CTRL_OK) st = ctrl_error_set(CTRL_ERR_IO, "%s: write failed", a.out);
    const double dt = ctrl_now() - t0, cpu = ctrl_clock_seconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    if (st == CTRL_OK) {
        long steps, pre, shared;
        ctrl_engine_stats(eng, &steps, &pre, &shared);
        if (isatty(fileno(stderr))) fputc('\n', stderr);
        CTRL_INFO(
            "%d prompts x %d: %ld tokens in %.2f s (%.0f tokens/s, %.2f CPU s), %ld steps, %ld preemptions, "
            "%ld shared prompt blocks; written to %s",
            n_req, a.n, total, dt, total / (dt > 0 ? dt : 1), cpu, steps, pre, shared, a.out);
    }
    for (int r = 0; r < n_req; r++) {
        cJSON_Delete(lines[r]);
        free((void *)reqs[r].prompt);
        for (int k = 0; outs && k < a.n; k++) ctrl_gen_output_free(&outs[(size_t)r * a.n + k]);
    }
    free(lines), free(reqs), free(outs);
    ctrl_engine_free(eng);
    ctrl_template_free(tpl);
    ctrl_tokenizer_free(tok);
    ctrl_model_free(m);
    return st == CTRL_OK ? 0 : cli_fail(st);
}

const ctrl_command cli_cmd_generate = {
    .name = "generate",
    .summary = "generate completions for JSONL prompts (paged KV cache, continuous batching)",
    .usage =
        "usage: ctrl generate --model DIR [--adapter DIR] --prompts FILE.jsonl --out FILE.jsonl [--chat] "
        "[--n N]\n"
        "                     [--max-tokens N] [--temperature T] [--top-p P] [--top-k K] [--min-p P]\n"
        "                     [--repetition-penalty R] [--seed S] [--kv-cache-mb N]\n"
        "                     [--kv-cache-dtype fp32|bf16] [--dtype fp32|bf16] [--decode-threads N]\n\n"
        "Each line {\"prompt\": \"...\"} (or {\"messages\": [...]} with --chat, formatted by the chat\n"
        "template with the generation prompt) gets its n completions, written as the same line with\n"
        "\"completions\": [{\"text\", \"token_ids\", \"logprobs\", \"finish_reason\"}]. Generation stops at\n"
        "generation_config.json's eos_token_id or max-tokens. temperature 0 is greedy; each line\n"
        "samples with seed + its line number, so a prompt's completions do not depend on the others.\n"
        "--dtype bf16: the linear layers and the LM head compute in bf16 (fp32 accumulation, as\n"
        "torch.autocast), on weights packed to bf16 once, before the first step, their fp32 copies\n"
        "given back where an AVX-512 BF16 or AMX GEMM runs (the log says which); the KV cache is then\n"
        "bf16 unless --kv-cache-dtype says fp32. A bf16 KV cache holds twice the tokens in --kv-cache-mb.\n"
        "--adapter DIR: a PEFT LoRA adapter directory over the --model base, applied in every step.\n"
        "--decode-threads N: the OpenMP threads of a step (as [generation] decode_threads); 0, the\n"
        "default, is every thread.\n",
    .run = run_generate,
};
