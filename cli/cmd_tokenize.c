/* ctrl tokenize --tokenizer DIR --input FILE.jsonl [--decode] [--no-special] */
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tokenizer/tokenizer.h"

static int run_tokenize(ctrl_cli *cli, int argc, char **argv) {
    (void)cli;
    const char *dir = NULL, *input = NULL;
    int decode = 0, special = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--decode"))
            decode = 1;
        else if (!strcmp(argv[i], "--no-special"))
            special = 0;
        else if (!strcmp(argv[i], "--chat"))
            return cli_usage_error(&cli_cmd_tokenize,
                                   "--chat needs the chat-template engine, which is not built yet");
        else if (i + 1 < argc && !strcmp(argv[i], "--tokenizer"))
            dir = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--input"))
            input = argv[++i];
        else
            return cli_usage_error(&cli_cmd_tokenize, "unexpected argument '%s'", argv[i]);
    }
    if (!dir || !input)
        return cli_usage_error(&cli_cmd_tokenize, "needs --tokenizer DIR and --input FILE.jsonl");
    ctrl_tokenizer *tok;
    ctrl_status st = ctrl_tokenizer_load(dir, &tok);
    if (st != CTRL_OK) return cli_fail(st);
    FILE *f = fopen(input, "r");
    if (!f) {
        ctrl_tokenizer_free(tok);
        ctrl_error_set(CTRL_ERR_IO, "%s: %s", input, strerror(errno));
        return cli_fail(CTRL_ERR_IO);
    }
    size_t cap = 1 << 20;
    char *line = malloc(cap);
    int lineno = 0;
    while (st == CTRL_OK && fgets(line, (int)cap, f)) {
        lineno++;
        if (line[strspn(line, " \t\r\n")] == '\0') continue;
        cJSON *o = cJSON_Parse(line), *out = cJSON_CreateObject();
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(o, "text");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "input_ids");
        if (!decode && cJSON_IsString(text)) {
            int32_t *v;
            size_t n;
            st = ctrl_tokenizer_encode(tok, text->valuestring, strlen(text->valuestring), special, &v, &n);
            if (st == CTRL_OK) {
                cJSON *a = cJSON_AddArrayToObject(out, "input_ids");
                for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
                free(v);
            }
        } else if (decode && cJSON_IsArray(ids)) {
            int n = cJSON_GetArraySize(ids), i = 0;
            int32_t *v = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
            for (const cJSON *e = ids->child; e; e = e->next)
                v[i++] = cJSON_IsNumber(e) ? (int32_t)e->valuedouble : -1;
            char *s;
            size_t len;
            st = ctrl_tokenizer_decode(tok, v, (size_t)n, !special, &s, &len);
            if (st == CTRL_OK) {
                cJSON_AddStringToObject(out, "text", s);
                free(s);
            }
            free(v);
        } else {
            st = ctrl_error_set(CTRL_ERR_FORMAT, "%s:%d: expected {\"%s\": ...}", input, lineno,
                                decode ? "input_ids" : "text");
        }
        if (st == CTRL_OK) {
            char *s = cJSON_PrintUnformatted(out);
            puts(s);
            cJSON_free(s);
        }
        cJSON_Delete(o);
        cJSON_Delete(out);
    }
    free(line);
    fclose(f);
    ctrl_tokenizer_free(tok);
    return st == CTRL_OK ? 0 : cli_fail(st);
}

const ctrl_command cli_cmd_tokenize = {
    .name = "tokenize",
    .summary = "token ids of JSONL text with a Hugging Face tokenizer (or --decode)",
    .usage = "usage: ctrl tokenize --tokenizer DIR --input FILE.jsonl [--decode] [--no-special]\n\n"
             "Each line {\"text\": ...} becomes {\"input_ids\": [...]} (special tokens added as the\n"
             "tokenizer's post-processor does, unless --no-special); with --decode, each line\n"
             "{\"input_ids\": [...]} becomes {\"text\": ...} (--no-special drops special tokens).\n"
             "Bit-exact with the tokenizers library for byte-level BPE tokenizers (Qwen, Llama-3).\n",
    .run = run_tokenize,
};
