/* Reading tokenizer.json (and tokenizer_config.json): the BPE model, the supported normalizer,
 * pre-tokenizer, post-processor and decoder configurations, and the added tokens. Anything else
 * is refused with a message naming the file and the part. */
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "file_text.h"
#include "tokenizer/tokenizer_internal.h"

#define MAX_FILE (256u << 20)

/* GPT-2's byte-to-character map: printable bytes map to themselves, the others to U+0100... */
static void byte_alphabet(ctrl_tokenizer *t) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        uint32_t cp = printable ? (uint32_t)b : 256u + (uint32_t)n++;
        t->byte_char_len[b] = (uint8_t)tok_utf8_encode(cp, t->byte_char[b]);
    }
}

const char *tok_json_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}
int tok_json_bool(const cJSON *o, const char *key, int fallback) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : fallback;
}

static ctrl_status load_model(ctrl_tokenizer *t, const cJSON *model, int n_added) {
    const char *type = tok_json_str(model, "type");
    if (!type || strcmp(type, "BPE") != 0)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s: model type '%s' is not supported (BPE only)",
                              t->path, type ? type : "(none)");
    t->byte_fallback = tok_json_bool(model, "byte_fallback", 0);
    t->fuse_unk = tok_json_bool(model, "fuse_unk", 0);
    const char *prefix = tok_json_str(model, "continuing_subword_prefix"),
               *suffix = tok_json_str(model, "end_of_word_suffix");
    if ((prefix && prefix[0]) || (suffix && suffix[0]))
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s: BPE subword prefixes/suffixes are not supported",
                              t->path);
    t->ignore_merges = tok_json_bool(model, "ignore_merges", 0);
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab))
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: model.vocab is not an object", t->path);
    ctrl_status st = tok_load_vocab(t, vocab, n_added);
    if (st != CTRL_OK) return st;
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (!cJSON_IsArray(merges))
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: model.merges is not an array", t->path);
    int nm = cJSON_GetArraySize(merges);
    t->merge_result = malloc(sizeof(int32_t) * (size_t)(nm ? nm : 1));
    if (!t->merge_result || tok_pairs_init(&t->merges, (size_t)nm + 16) != 0)
        return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: merges");
    int rank = 0;
    for (const cJSON *e = merges->child; e; e = e->next, rank++) {
        char a[512], b[512];
        if (cJSON_IsString(e)) { /* "a b" (exactly one space; "#version" lines are skipped) */
            const char *sp = strchr(e->valuestring, ' ');
            if (!strncmp(e->valuestring, "#version", 8)) {
                rank--;
                continue;
            }
            if (!sp || strchr(sp + 1, ' ') || (size_t)(sp - e->valuestring) >= sizeof a ||
                strlen(sp + 1) >= sizeof b)
                return ctrl_error_set(CTRL_ERR_FORMAT, "%s: merge %d ('%s') is not 'a b'", t->path, rank,
                                      e->valuestring);
            memcpy(a, e->valuestring, (size_t)(sp - e->valuestring));
            a[sp - e->valuestring] = '\0';
            strcpy(b, sp + 1);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 && cJSON_IsString(e->child) &&
                   cJSON_IsString(e->child->next) && strlen(e->child->valuestring) < sizeof a &&
                   strlen(e->child->next->valuestring) < sizeof b) { /* ["a", "b"] */
            strcpy(a, e->child->valuestring);
            strcpy(b, e->child->next->valuestring);
        } else {
            return ctrl_error_set(CTRL_ERR_FORMAT, "%s: merge %d is neither 'a b' nor [a, b]", t->path, rank);
        }
        char ab[1024];
        const size_t la = strlen(a), lb = strlen(b);
        memcpy(ab, a, la), memcpy(ab + la, b, lb + 1);
        int32_t ia = tok_map_get(&t->vocab, a, la), ib = tok_map_get(&t->vocab, b, lb);
        int32_t iab = tok_map_get(&t->vocab, ab, la + lb);
        if (ia < 0 || ib < 0 || iab < 0)
            return ctrl_error_set(CTRL_ERR_FORMAT,
                                  "%s: merge %d ('%s' '%s') uses a token missing from the vocabulary",
                                  t->path, rank, a, b);
        /* a repeated pair takes its last rank, as the library's map collects them */
        tok_pairs_put(&t->merges, ia, ib, rank);
        t->merge_result[rank] = iab;
    }
    return CTRL_OK;
}

static ctrl_status load_normalizer(ctrl_tokenizer *t, const cJSON *n) {
    if (!n || cJSON_IsNull(n)) return CTRL_OK;
    const char *type = tok_json_str(n, "type");
    int kind = !type                      ? 0
               : !strcmp(type, "NFC")     ? TOK_NORM_NFC
               : !strcmp(type, "Prepend") ? TOK_NORM_PREPEND
               : !strcmp(type, "Replace") ? TOK_NORM_REPLACE
                                          : 0;
    if (kind) {
        const char *a = kind == TOK_NORM_PREPEND ? tok_json_str(n, "prepend")
                        : kind == TOK_NORM_REPLACE
                            ? tok_json_str(cJSON_GetObjectItemCaseSensitive(n, "pattern"), "String")
                            : "";
        const char *b = kind == TOK_NORM_REPLACE ? tok_json_str(n, "content") : "";
        if (!a || !b || (kind == TOK_NORM_REPLACE && !a[0]))
            return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                                  "%s: normalizer %s: only a literal String pattern is supported", t->path,
                                  type);
        if (t->n_norm_ops == (int)(sizeof t->norm_ops / sizeof t->norm_ops[0]))
            return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s: too many normalizers", t->path);
        t->norm_ops[t->n_norm_ops++] = (struct tok_norm_op){kind, strdup(a), strdup(b)};
        t->nfc |= kind == TOK_NORM_NFC;
        return CTRL_OK;
    }
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        for (const cJSON *e = list ? list->child : NULL; e; e = e->next) {
            ctrl_status st = load_normalizer(t, e);
            if (st != CTRL_OK) return st;
        }
        return CTRL_OK;
    }
    return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                          "%s: normalizer '%s' is not supported (NFC, Prepend, Replace)", t->path,
                          type ? type : "?");
}

/* The GPT-2 pre-tokenizer regex, used by ByteLevel with use_regex = true. */
static const char *const GPT2_PATTERN =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static ctrl_status compile_split(ctrl_tokenizer *t, const char *pattern) {
    if (t->split)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s: more than one regex pre-tokenizer", t->path);
    int err;
    PCRE2_SIZE off;
    t->split =
        pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    if (!t->split) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: pre-tokenizer regex at offset %zu: %s", t->path,
                              (size_t)off, msg);
    }
    pcre2_jit_compile(t->split, PCRE2_JIT_COMPLETE); /* faster when available; fine when not */
    return CTRL_OK;
}

static ctrl_status load_pre_tokenizer(ctrl_tokenizer *t, const cJSON *p) {
    if (!p || cJSON_IsNull(p)) return CTRL_OK;
    const char *type = tok_json_str(p, "type");
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
        for (const cJSON *e = list ? list->child : NULL; e; e = e->next) {
            ctrl_status st = load_pre_tokenizer(t, e);
            if (st != CTRL_OK) return st;
        }
        return CTRL_OK;
    }
    if (type && !strcmp(type, "Split")) {
        const cJSON *pat = cJSON_GetObjectItemCaseSensitive(p, "pattern");
        const char *re = tok_json_str(pat, "Regex"), *behavior = tok_json_str(p, "behavior");
        if (!re || !behavior || strcmp(behavior, "Isolated") != 0 || tok_json_bool(p, "invert", 0))
            return ctrl_error_set(
                CTRL_ERR_UNSUPPORTED,
                "%s: Split pre-tokenizer: only a Regex pattern with behavior Isolated is supported", t->path);
        return compile_split(t, re);
    }
    if (type && !strcmp(type, "Metaspace")) {
        t->metaspace = 1;
        return tok_load_meta(t, p, &t->meta_prepend, &t->meta_split, t->meta);
    }
    if (type && !strcmp(type, "ByteLevel")) {
        if (tok_json_bool(p, "add_prefix_space", 0))
            return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                                  "%s: ByteLevel add_prefix_space = true is not supported yet", t->path);
        t->byte_level = 1;
        return tok_json_bool(p, "use_regex", 1) ? compile_split(t, GPT2_PATTERN) : CTRL_OK;
    }
    return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                          "%s: pre-tokenizer '%s' is not supported (Split, ByteLevel, Metaspace)", t->path,
                          type ? type : "?");
}

ctrl_status tok_load_meta(const ctrl_tokenizer *t, const cJSON *p, int *scheme, int *split, char meta[5]) {
    const char *rep = tok_json_str(p, "replacement"), *ps = tok_json_str(p, "prepend_scheme");
    size_t i = 0;
    if (rep && rep[0]) tok_utf8_decode(rep, strlen(rep), &i);
    if (!rep || !rep[0] || rep[i] || i > 4)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: Metaspace needs a one-character replacement", t->path);
    memcpy(meta, rep, i + 1);
    *scheme = !ps || !strcmp(ps, "always") ? TOK_META_ALWAYS
              : !strcmp(ps, "first")       ? TOK_META_FIRST
              : !strcmp(ps, "never")       ? TOK_META_NEVER
                                           : -1;
    if (*scheme < 0)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: Metaspace prepend_scheme '%s' is unknown", t->path, ps);
    const cJSON *aps = cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space");
    if (cJSON_IsFalse(aps)) { /* the older form; the library refuses a contradiction */
        if (*scheme != TOK_META_NEVER)
            return ctrl_error_set(CTRL_ERR_FORMAT,
                                  "%s: Metaspace add_prefix_space does not match declared prepend_scheme",
                                  t->path);
    }
    *split = tok_json_bool(p, "split", 1);
    return CTRL_OK;
}

static ctrl_status load_decoder(ctrl_tokenizer *t, const cJSON *d) {
    if (!d || cJSON_IsNull(d)) return CTRL_OK;
    const char *type = tok_json_str(d, "type");
    if (type && !strcmp(type, "ByteLevel")) return CTRL_OK;
    return tok_load_decoder_chain(t, d);
}

/* TemplateProcessing "single": [SpecialToken]? Sequence A [SpecialToken]? — only a leading
 * special token (BOS) is supported; ByteLevel and RobertaProcessing-free configs add nothing. */
static ctrl_status load_post_processor(ctrl_tokenizer *t, const cJSON *p) {
    if (!p || cJSON_IsNull(p)) return CTRL_OK;
    const char *type = tok_json_str(p, "type");
    if (type && !strcmp(type, "ByteLevel")) return CTRL_OK;
    if (type && !strcmp(type, "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "processors");
        for (const cJSON *e = list ? list->child : NULL; e; e = e->next) {
            ctrl_status st = load_post_processor(t, e);
            if (st != CTRL_OK) return st;
        }
        return CTRL_OK;
    }
    if (type && !strcmp(type, "TemplateProcessing")) {
        const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
        int seen_seq = 0;
        for (const cJSON *e = single ? single->child : NULL; e; e = e->next) {
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
            if (cJSON_GetObjectItemCaseSensitive(e, "Sequence")) {
                seen_seq = 1;
            } else if (sp && !seen_seq) {
                int32_t v;
                ctrl_status st = tok_template_token(t, p, tok_json_str(sp, "id"), &v);
                if (st != CTRL_OK) return st;
                t->add_bos = 1, t->bos_id = v;
            } else {
                return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                                      "%s: TemplateProcessing with trailing tokens is not supported",
                                      t->path);
            }
        }
        return CTRL_OK;
    }
    return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s: post-processor '%s' is not supported", t->path,
                          type ? type : "?");
}

/* After the normalizer is known: normalized=true tokens of SentencePiece-style models are matched
 * in the normalized text as their normalized content (the library's second pass); byte-level
 * models match all added tokens in the raw text. */
static ctrl_status index_added(ctrl_tokenizer *t) {
    for (int k = 0; k < t->n_added; k++) {
        tok_added *a = &t->added[k];
        if (a->normalized && !t->byte_level) {
            a->norm_content = tok_normalize(t, a->content, a->len, &a->norm_len);
            if (!a->norm_content) return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory");
            if (!a->norm_len) { /* normalizes to nothing: never matches */
                free(a->norm_content), a->norm_content = NULL;
                continue;
            }
            t->n_norm_added++;
            t->added_first[1][(unsigned char)a->norm_content[0]] = 1;
        } else {
            t->added_first[0][(unsigned char)a->content[0]] = 1;
        }
    }
    return CTRL_OK;
}

/* bos_token etc. are absent, null, strings or {"content": ...}; a token they name must exist
 * (a missing eos_token would silently never end generation). */
static ctrl_status config_token(const ctrl_tokenizer *t, const char *path, const cJSON *cfg, const char *key,
                                int32_t *id) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    *id = -1;
    if (!v || cJSON_IsNull(v)) return CTRL_OK;
    const char *s = cJSON_IsString(v) ? v->valuestring : tok_json_str(v, "content");
    if (!s)
        return ctrl_error_set(CTRL_ERR_FORMAT,
                              "%s: %s is neither a string nor an object with a string content", path, key);
    *id = ctrl_tokenizer_token_to_id(t, s);
    if (*id < 0)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: %s '%s' is not a token of %s", path, key, s, t->path);
    return CTRL_OK;
}

/* chat_template.jinja (the file transformers 5 writes and newer models ship): when present it is the
 * chat template, ahead of tokenizer_config.json's, as transformers reads them. */
static ctrl_status load_template_file(ctrl_tokenizer *t, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) return CTRL_OK;
    ctrl_status st;
    char *text = ctrl_read_text_file(path, MAX_FILE, &st);
    if (!text) return st;
    free(t->chat_template);
    t->chat_template = text;
    return CTRL_OK;
}

static ctrl_status load_config(ctrl_tokenizer *t, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    struct stat sb;
    if (stat(path, &sb) != 0) return load_template_file(t, dir);
    ctrl_status st;
    cJSON *cfg = ctrl_read_json_object(path, MAX_FILE, &st);
    if (!cfg) return st;
    int32_t bos;
    st = config_token(t, path, cfg, "bos_token", &bos);
    if (st == CTRL_OK) st = config_token(t, path, cfg, "eos_token", &t->eos_id);
    if (st == CTRL_OK) st = config_token(t, path, cfg, "pad_token", &t->pad_id);
    if (bos >= 0 && !t->add_bos) t->bos_id = bos;
    const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (st == CTRL_OK && tmpl && !cJSON_IsNull(tmpl) && !cJSON_IsString(tmpl) && !cJSON_IsArray(tmpl))
        st = ctrl_error_set(CTRL_ERR_FORMAT,
                            "%s: chat_template is neither a string nor a list of {name, template}", path);
    if (st != CTRL_OK) {
        cJSON_Delete(cfg);
        return st;
    }
    if (cJSON_IsString(tmpl)) t->chat_template = strdup(tmpl->valuestring);
    for (const cJSON *e = cJSON_IsArray(tmpl) ? tmpl->child : NULL; e && !t->chat_template; e = e->next) {
        const char *name = tok_json_str(e, "name"), *body = tok_json_str(e, "template");
        if (name && body && !strcmp(name, "default")) t->chat_template = strdup(body);
    }
    cJSON_Delete(cfg);
    return load_template_file(t, dir);
}

ctrl_status ctrl_tokenizer_load(const char *path, ctrl_tokenizer **out) {
    *out = NULL;
    char dir[4096], file[4200];
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        snprintf(dir, sizeof dir, "%s", path);
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
        snprintf(dir, sizeof dir, "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash)
            *slash = '\0';
        else
            strcpy(dir, ".");
    }
    ctrl_status st;
    char *text = ctrl_read_text_file(file, MAX_FILE, &st);
    if (!text) return st;
    cJSON *root = cJSON_Parse(text);
    free(text);
    ctrl_tokenizer *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(file))) {
        cJSON_Delete(root);
        free(t);
        return ctrl_error_set(CTRL_ERR_NOMEM, "tokenizer: out of memory");
    }
    t->bos_id = t->eos_id = t->pad_id = t->unk_id = -1;
    byte_alphabet(t);
    if (!cJSON_IsObject(root)) {
        st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: not a JSON object (truncated or not a tokenizer.json)",
                            file);
    } else {
        const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
        const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
        st = model ? load_model(t, model, cJSON_IsArray(added) ? cJSON_GetArraySize(added) : 0)
                   : ctrl_error_set(CTRL_ERR_FORMAT, "%s: no model", file);
        const char *unk = st == CTRL_OK ? tok_json_str(model, "unk_token") : NULL;
        if (unk) t->unk_id = tok_map_get(&t->vocab, unk, strlen(unk)), t->unk_missing = t->unk_id < 0;
        if (st == CTRL_OK) st = tok_load_added(t, added);
        if (st == CTRL_OK) st = load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"));
        if (st == CTRL_OK)
            st = load_pre_tokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"));
        if (st == CTRL_OK)
            st = load_post_processor(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
        if (st == CTRL_OK) st = load_decoder(t, cJSON_GetObjectItemCaseSensitive(root, "decoder"));
        if (st == CTRL_OK && t->byte_level && (t->decoder_chain || t->metaspace))
            st = ctrl_error_set(
                CTRL_ERR_UNSUPPORTED,
                "%s: a ByteLevel pre-tokenizer with a Metaspace pre-tokenizer or a decoder other "
                "than ByteLevel is not supported",
                file);
        if (st == CTRL_OK && !t->byte_level && t->split)
            st = ctrl_error_set(
                CTRL_ERR_UNSUPPORTED,
                "%s: a Split pre-tokenizer without ByteLevel is not supported (supported: byte-level "
                "BPE, and SentencePiece-style BPE with no pre-tokenizer or Metaspace)",
                file);
        if (st == CTRL_OK && !t->byte_level && !t->byte_fallback && t->unk_id < 0 && !t->metaspace &&
            !t->n_norm_ops)
            st = ctrl_error_set(
                CTRL_ERR_UNSUPPORTED,
                "%s: a BPE without a byte-level pre-tokenizer, byte_fallback, unk_token or "
                "normalizer is not a supported configuration (byte-level or SentencePiece-style)",
                file);
        if (st == CTRL_OK && !t->byte_level) t->decoder_chain = 1; /* no decoder: tokens joined by spaces */
        if (st == CTRL_OK) st = index_added(t);
    }
    cJSON_Delete(root);
    if (st == CTRL_OK) {
        for (int b = 0; b < 256; b++) { /* byte-fallback tokens <0x00>..<0xFF> */
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", b);
            t->byte_id[b] = tok_map_get(&t->vocab, name, 6);
        }
        st = tok_index_joinable(t);
        if (st == CTRL_OK) st = load_config(t, dir);
    }
    if (st != CTRL_OK) {
        ctrl_tokenizer_free(t);
        return st;
    }
    *out = t;
    return CTRL_OK;
}

void ctrl_tokenizer_free(ctrl_tokenizer *t) {
    if (!t) return;
    tok_map_free(&t->vocab);
    tok_pairs_free(&t->merges);
    tok_pairs_free(&t->joinable);
    free(t->merge_result);
    free(t->id_to_token);
    if (t->split) pcre2_code_free(t->split);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content), free(t->added[i].norm_content);
    free(t->added);
    free(t->chat_template);
    for (int i = 0; i < t->n_norm_ops; i++) free(t->norm_ops[i].a), free(t->norm_ops[i].b);
    for (int i = 0; i < t->n_dec_ops; i++) free(t->dec_ops[i].a), free(t->dec_ops[i].b);
    free(t->path);
    free(t);
}
