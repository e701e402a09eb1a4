/* ctrl tokenize --tokenizer DIR --input FILE.jsonl [--decode] [--no-special]
 *               [--chat [--add-generation-prompt] [--assistant-mask] [--chat-template FILE]] */
#include <cJSON.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "file_text.h"
#include "template/chat.h"
#include "tokenizer/tokenizer.h"

static void add_int_array(cJSON *out, const char *name, const int32_t *v, const uint8_t *m, size_t n) {
    cJSON *a = cJSON_AddArrayToObject(out, name);
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v ? v[i] : m[i]));
}

/* --chat: the line's members are the template's variables ("messages", and e.g. "tools",
 * "enable_thinking"); ids as apply_chat_template(tokenize=True) gives them. */
static ctrl_status chat_line(const ctrl_tokenizer *tok, const ctrl_template *tpl, cJSON *o, int add_gen,
                             int masks, cJSON *out) {
    if (!cJSON_HasObjectItem(o, "add_generation_prompt"))
        cJSON_AddBoolToObject(o, "add_generation_prompt", add_gen);
    ctrl_chat_add_special_tokens(tok, o);
    int32_t *ids;
    size_t n;
    uint8_t *mask = NULL;
    ctrl_status st = ctrl_chat_encode(tok, tpl, o, &ids, &n, masks ? &mask : NULL);
    if (st != CTRL_OK) return st;
    add_int_array(out, "input_ids", ids, NULL, n);
    if (mask) add_int_array(out, "assistant_masks", NULL, mask, n);
    free(ids);
    free(mask);
    return CTRL_OK;
}

static int run_tokenize(ctrl_cli *cli, int argc, char **argv) {
    (void)cli;
    const char *dir = NULL, *input = NULL, *template_file = NULL;
    int decode = 0, special = 1, chat = 0, add_gen = 0, masks = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--decode"))
            decode = 1;
        else if (!strcmp(argv[i], "--no-special"))
            special = 0;
        else if (!strcmp(argv[i], "--chat"))
            chat = 1;
        else if (!strcmp(argv[i], "--add-generation-prompt"))
            add_gen = 1;
        else if (!strcmp(argv[i], "--assistant-mask"))
            masks = 1;
        else if (i + 1 < argc && !strcmp(argv[i], "--chat-template"))
            template_file = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--tokenizer"))
            dir = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--input"))
            input = argv[++i];
        else
            return cli_usage_error(&cli_cmd_tokenize, "unexpected argument '%s'", argv[i]);
    }
    if (!dir || !input)
        return cli_usage_error(&cli_cmd_tokenize, "needs --tokenizer DIR and --input FILE.jsonl");
    if (chat && decode) return cli_usage_error(&cli_cmd_tokenize, "--chat and --decode do not go together");
    if (!chat && (add_gen || masks || template_file))
        return cli_usage_error(&cli_cmd_tokenize,
                               "--add-generation-prompt, --assistant-mask and --chat-template need --chat");
    ctrl_tokenizer *tok;
    ctrl_status st = ctrl_tokenizer_load(dir, &tok);
    if (st != CTRL_OK) return cli_fail(st);
    ctrl_template *tpl = NULL;
    if (chat && template_file) {
        char *src = ctrl_read_text_file(template_file, 1 << 20, &st);
        if (src) st = ctrl_template_compile(src, strlen(src), template_file, &tpl);
        free(src);
    } else if (chat) {
        st = ctrl_chat_template_load(tok, &tpl);
    }
    if (st != CTRL_OK) {
        ctrl_tokenizer_free(tok);
        return cli_fail(st);
    }
    FILE *f = fopen(input, "r");
    if (!f) {
        ctrl_tokenizer_free(tok);
        ctrl_error_set(CTRL_ERR_IO, "%s: %s", input, strerror(errno));
        return cli_fail(CTRL_ERR_IO);
    }
    size_t cap = 0;
    char *line = NULL; /* a line of any length (a row of many MB is one line) */
    int lineno = 0;
    while (st == CTRL_OK && getline(&line, &cap, f) >= 0) {
        lineno++;
        if (cli_interrupted()) {
            st = ctrl_error_set(CTRL_ERR_INTERRUPTED, "%s: interrupted before line %d", input, lineno);
            break;
        }
        if (line[strspn(line, " \t\r\n")] == '\0') continue;
        cJSON *o = cJSON_Parse(line), *out = cJSON_CreateObject();
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(o, "text");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "input_ids");
        if (chat && cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(o, "messages"))) {
            st = chat_line(tok, tpl, o, add_gen, masks, out);
            if (st != CTRL_OK) ctrl_error_wrap(st, "%s:%d", input, lineno);
        } else if (!chat && !decode && cJSON_IsString(text)) {
            int32_t *v;
            size_t n;
            st = ctrl_tokenizer_encode(tok, text->valuestring, strlen(text->valuestring), special, &v, &n);
            if (st != CTRL_OK) ctrl_error_wrap(st, "%s:%d", input, lineno);
            if (st == CTRL_OK) {
                cJSON *a = cJSON_AddArrayToObject(out, "input_ids");
                for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
                free(v);
            }
        } else if (decode && cJSON_IsArray(ids)) {
            int n = cJSON_GetArraySize(ids), i = 0;
            int32_t *v = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
            for (const cJSON *e = ids->child; e; e = e->next)
                v[i++] = cJSON_IsNumber(e) && e->valuedouble >= 0 && e->valuedouble <= INT32_MAX
                             ? (int32_t)e->valuedouble
                             : -1; /* not an id: decodes to nothing (a cast of it would be undefined) */
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
                                chat     ? "messages"
                                : decode ? "input_ids"
                                         : "text");
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
    ctrl_template_free(tpl);
    ctrl_tokenizer_free(tok);
    return st == CTRL_OK ? 0 : cli_fail(st);
}

const ctrl_command cli_cmd_tokenize = {
    .name = "tokenize",
    .summary = "token ids of JSONL text with a Hugging Face tokenizer (or --decode)",
    .usage =
        "usage: ctrl tokenize --tokenizer DIR --input FILE.jsonl [--decode] [--no-special]\n"
        "       ctrl tokenize --tokenizer DIR --input FILE.jsonl --chat [--add-generation-prompt]\n"
        "                     [--assistant-mask] [--chat-template FILE.jinja]\n\n"
        "Each line {\"text\": ...} becomes {\"input_ids\": [...]} (special tokens added as the\n"
        "tokenizer's post-processor does, unless --no-special); with --decode, each line\n"
        "{\"input_ids\": [...]} becomes {\"text\": ...} (--no-special drops special tokens).\n"
        "With --chat, each line {\"messages\": [...], ...} is formatted with the tokenizer's chat\n"
        "template (or --chat-template; the line's other members are template variables, e.g.\n"
        "\"enable_thinking\") and tokenized as apply_chat_template(tokenize=True) does;\n"
        "--assistant-mask adds \"assistant_masks\" from the template's {% generation %} blocks.\n"
        "Bit-exact with the tokenizers library for byte-level BPE (Qwen, Llama-3) and SentencePiece-style\n"
        "BPE with byte fallback (Llama-2, Mistral); assistant masks need a byte-level tokenizer.\n",
    .run = run_tokenize,
};
