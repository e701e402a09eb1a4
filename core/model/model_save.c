/* Saving a model as a Hugging Face directory that transformers (and vLLM) load unchanged, as
 * save_pretrained writes it: config.json -- the source model's carried over with only what changed
 * rewritten (config_carry.c), or, for a model made here, generated from its config --, the weights
 * under the HF parameter names in f32, bf16 or f16, sharded above max_shard_size
 * (model_shards.c), and generation_config.json (the source's, else bos/eos). Every file is written
 * to a temporary name, fsynced and renamed. */
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/model.h"
#include "model/model_internal.h"
#include "model/safetensors.h"

ctrl_status model_write_text_atomic(const char *path, const char *text) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return ctrl_error_set(CTRL_ERR_IO, "%s: %s", tmp, strerror(errno));
    int bad = fputs(text, f) < 0;
    bad |= fflush(f) != 0;
    bad |= fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        int err = errno;
        unlink(tmp);
        return ctrl_error_set(CTRL_ERR_IO, "%s: cannot write: %s", path, strerror(err));
    }
    return CTRL_OK;
}

static const char *const arch_name[CTRL_ARCH_COUNT] = {"Llama",  "Qwen2", "Qwen3",    "Mistral", "Gemma2",
                                                       "Gemma3", "Phi3",  "Qwen3Moe", "Mixtral", "Olmoe"};
static const char *const rope_names[] = {"default", "linear", "llama3", "yarn", "dynamic", "longrope"};

/* A float-typed field as its shortest decimal, written as a float (30.0, not 30: transformers 5's
 * config classes check the JSON type). */
static void add_float(cJSON *o, const char *key, float v) {
    char text[40];
    snprintf(text, sizeof text, "%.7g", (double)v);
    if (!strpbrk(text, ".eEn")) strcat(text, ".0");
    cJSON_AddRawToObject(o, key, text);
}

/* Gemma 2's own fields (Gemma2Config's names): soft-capping (null: none), query_pre_attn_scalar, the
 * window and which layers slide. */
static void gemma_config_json(cJSON *o, const ctrl_model_config *c) {
    cJSON_AddNumberToObject(o, "query_pre_attn_scalar",
                            c->query_pre_attn_scalar); /* an int in Gemma2Config */
    if (c->attn_softcap > 0)
        add_float(o, "attn_logit_softcapping", c->attn_softcap);
    else
        cJSON_AddNullToObject(o, "attn_logit_softcapping");
    if (c->final_softcap > 0)
        add_float(o, "final_logit_softcapping", c->final_softcap);
    else
        cJSON_AddNullToObject(o, "final_logit_softcapping");
    if (c->sliding_window > 0)
        cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window);
    else
        cJSON_AddNullToObject(o, "sliding_window");
    cJSON *types = cJSON_AddArrayToObject(o, "layer_types");
    for (int l = 0; l < c->n_layers; l++)
        cJSON_AddItemToArray(types, cJSON_CreateString(!c->has_layer_types || c->sliding_layer[l]
                                                           ? "sliding_attention"
                                                           : "full_attention"));
    cJSON_AddBoolToObject(o, "attention_bias", c->qkv_bias);
    /* transformers' default pad_token_id for Gemma is 0: say which one this model has */
    if (c->num_labels <= 0 && c->pad_token_id >= 0)
        cJSON_AddNumberToObject(o, "pad_token_id", c->pad_token_id);
    else if (c->num_labels <= 0)
        cJSON_AddNullToObject(o, "pad_token_id");
}

/* A rope dict: rope_scaling's keys (with_theta: and rope_theta, as rope_parameters has it). */
/* A list of n floats (longrope's factors) as JSON floats. */
static void add_floats(cJSON *o, const char *key, const float *v, int n) {
    cJSON *a = cJSON_AddArrayToObject(o, key);
    for (int i = 0; i < n; i++) {
        char text[40];
        snprintf(text, sizeof text, "%.9g", (double)v[i]);
        if (!strpbrk(text, ".eEn")) strcat(text, ".0");
        cJSON_AddItemToArray(a, cJSON_CreateRaw(text));
    }
}

static void rope_json(cJSON *r, const ctrl_rope_params *p, int with_theta) {
    if (with_theta) cJSON_AddNumberToObject(r, "rope_theta", p->theta);
    cJSON_AddStringToObject(r, "rope_type", rope_names[p->kind]);
    if (p->kind != CTRL_ROPE_DEFAULT)
        add_float(r, "factor", (float)p->factor); /* a float, as transformers checks */
    if (p->kind == CTRL_ROPE_LLAMA3) {
        cJSON_AddNumberToObject(r, "low_freq_factor", p->low_freq_factor);
        cJSON_AddNumberToObject(r, "high_freq_factor", p->high_freq_factor);
    }
    if (p->kind == CTRL_ROPE_LLAMA3 || p->kind == CTRL_ROPE_YARN || p->kind == CTRL_ROPE_LONGROPE)
        cJSON_AddNumberToObject(r, "original_max_position_embeddings", p->original_max_position);
    if (p->kind == CTRL_ROPE_LONGROPE) {
        add_floats(r, "short_factor", p->short_factor, p->n_factors);
        add_floats(r, "long_factor", p->long_factor, p->n_factors);
        if (p->attention_factor > 0) add_float(r, "attention_factor", (float)p->attention_factor);
    }
    if (p->kind == CTRL_ROPE_YARN) {
        cJSON_AddNumberToObject(r, "beta_fast", p->beta_fast);
        cJSON_AddNumberToObject(r, "beta_slow", p->beta_slow);
        if (p->attention_factor > 0) cJSON_AddNumberToObject(r, "attention_factor", p->attention_factor);
    }
}

static const char *dtype_name(ctrl_dtype dtype) {
    return dtype == CTRL_BF16 ? "bfloat16" : dtype == CTRL_F16 ? "float16" : "float32";
}

/* The transformers class of the model: ARCHFor{CausalLM,SequenceClassification}. */
static void class_name(const ctrl_model_config *c, char *cls, size_t cap) {
    snprintf(cls, cap, "%sFor%s", arch_name[c->arch],
             c->num_labels > 0 ? "SequenceClassification" : "CausalLM");
}

static char *config_json(const ctrl_model_config *c, ctrl_dtype dtype) {
    cJSON *o = cJSON_CreateObject();
    cJSON *archs = cJSON_AddArrayToObject(o, "architectures");
    char cls[64];
    class_name(c, cls, sizeof cls);
    cJSON_AddItemToArray(archs, cJSON_CreateString(cls));
    if (c->num_labels > 0) { /* transformers derives num_labels from id2label */
        cJSON *id2label = cJSON_AddObjectToObject(o, "id2label"),
              *label2id = cJSON_AddObjectToObject(o, "label2id");
        for (int i = 0; i < c->num_labels; i++) {
            char id[16], label[32];
            snprintf(id, sizeof id, "%d", i), snprintf(label, sizeof label, "LABEL_%d", i);
            cJSON_AddStringToObject(id2label, id, label);
            cJSON_AddNumberToObject(label2id, label, i);
        }
        if (c->pad_token_id >= 0) cJSON_AddNumberToObject(o, "pad_token_id", c->pad_token_id);
    }
    cJSON_AddStringToObject(o, "model_type", c->model_type);
    cJSON_AddNumberToObject(o, "hidden_size", c->hidden_size);
    cJSON_AddNumberToObject(o, "intermediate_size", c->intermediate_size);
    cJSON_AddNumberToObject(o, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(o, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(o, "num_key_value_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(o, "head_dim", c->head_dim);
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(o, "max_position_embeddings", c->max_position_embeddings);
    /* eps is kept as float: print its shortest decimal so 1e-6 stays 1e-6, not 9.99999997e-07. */
    char eps[32];
    snprintf(eps, sizeof eps, "%.7g", (double)c->rms_norm_eps);
    cJSON_AddNumberToObject(o, "rms_norm_eps", strtod(eps, NULL));
    if (c->mlp_act == CTRL_ACT_GELU_TANH)
        cJSON_AddStringToObject(o, "hidden_activation", "gelu_pytorch_tanh");
    else
        cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_word_embeddings);
    if (c->arch == CTRL_ARCH_LLAMA || c->arch == CTRL_ARCH_QWEN3 || c->arch == CTRL_ARCH_QWEN3_MOE ||
        c->arch == CTRL_ARCH_OLMOE)
        cJSON_AddBoolToObject(o, "attention_bias", c->qkv_bias);
    if (c->arch == CTRL_ARCH_MIXTRAL) { /* MixtralConfig's keys */
        cJSON_AddNumberToObject(o, "num_local_experts", c->n_experts);
        cJSON_AddNumberToObject(o, "num_experts_per_tok", c->n_experts_per_tok);
        add_float(o, "router_aux_loss_coef", c->router_aux_loss_coef);
        cJSON_AddBoolToObject(o, "output_router_logits", c->output_router_logits);
    } else if (c->arch == CTRL_ARCH_OLMOE) { /* OlmoeConfig's keys (experts of intermediate_size) */
        cJSON_AddNumberToObject(o, "num_experts", c->n_experts);
        cJSON_AddNumberToObject(o, "num_experts_per_tok", c->n_experts_per_tok);
        cJSON_AddBoolToObject(o, "norm_topk_prob", c->norm_topk_prob);
        add_float(o, "router_aux_loss_coef", c->router_aux_loss_coef);
        cJSON_AddBoolToObject(o, "output_router_logits", c->output_router_logits);
        cJSON_AddNullToObject(o, "clip_qkv");
        /* OlmoeConfig defaults pad 1, eos 50279: say which ones this model has (null: none) */
        if (c->num_labels <= 0 && c->pad_token_id >= 0)
            cJSON_AddNumberToObject(o, "pad_token_id", c->pad_token_id);
        if (c->num_labels <= 0 && c->pad_token_id < 0) cJSON_AddNullToObject(o, "pad_token_id");
        if (c->eos_token_id < 0) cJSON_AddNullToObject(o, "eos_token_id");
    } else if (c->n_experts > 0) { /* Qwen3MoeConfig's keys; the dense layers as mlp_only_layers */
        cJSON_AddNumberToObject(o, "num_experts", c->n_experts);
        cJSON_AddNumberToObject(o, "num_experts_per_tok", c->n_experts_per_tok);
        cJSON_AddNumberToObject(o, "moe_intermediate_size", c->moe_intermediate_size);
        cJSON_AddBoolToObject(o, "norm_topk_prob", c->norm_topk_prob);
        cJSON_AddNumberToObject(o, "decoder_sparse_step", 1);
        cJSON *dense = cJSON_AddArrayToObject(o, "mlp_only_layers");
        for (int l = 0; l < c->n_layers; l++)
            if (!c->moe_layer[l]) cJSON_AddItemToArray(dense, cJSON_CreateNumber(l));
        add_float(o, "router_aux_loss_coef", c->router_aux_loss_coef);
        cJSON_AddBoolToObject(o, "output_router_logits", c->output_router_logits);
    }
    if (c->arch == CTRL_ARCH_GEMMA2 || c->arch == CTRL_ARCH_GEMMA3) {
        gemma_config_json(o, c);
    } else if (c->arch == CTRL_ARCH_MISTRAL || c->arch == CTRL_ARCH_PHI3 || c->arch == CTRL_ARCH_MIXTRAL) {
        if (c->sliding_window > 0)
            cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window);
        else
            cJSON_AddNullToObject(o, "sliding_window");
        /* Phi3Config defaults bos 1, eos and pad 32000: say which ones this model has (null: none) */
        if (c->arch == CTRL_ARCH_PHI3 && c->num_labels <= 0) {
            const char *keys[3] = {"bos_token_id", "eos_token_id", "pad_token_id"};
            const int ids[3] = {c->bos_token_id, c->eos_token_id, c->pad_token_id};
            for (int i = 0; i < 3; i++)
                if (ids[i] < 0) cJSON_AddNullToObject(o, keys[i]);
            if (c->pad_token_id >= 0) cJSON_AddNumberToObject(o, "pad_token_id", c->pad_token_id);
        }
    } else if (c->arch != CTRL_ARCH_LLAMA) {
        cJSON_AddBoolToObject(o, "use_sliding_window", c->sliding_window > 0);
        if (c->sliding_window > 0) cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window);
    }
    if (c->local_rope) { /* Gemma 3: one dict per layer type, as transformers 5 writes it */
        cJSON *p = cJSON_AddObjectToObject(o, "rope_parameters");
        rope_json(cJSON_AddObjectToObject(p, "full_attention"), &c->rope, 1);
        rope_json(cJSON_AddObjectToObject(p, "sliding_attention"), &c->rope_local, 1);
    } else {
        cJSON_AddNumberToObject(o, "rope_theta", c->rope.theta);
        if (c->rope.partial_rotary_factor != 1.0)
            add_float(o, "partial_rotary_factor", (float)c->rope.partial_rotary_factor);
        if (c->original_max_position_embeddings > 0)
            cJSON_AddNumberToObject(o, "original_max_position_embeddings",
                                    c->original_max_position_embeddings);
        if (c->rope.kind != CTRL_ROPE_DEFAULT)
            rope_json(cJSON_AddObjectToObject(o, "rope_scaling"), &c->rope, 0);
    }
    if (c->bos_token_id >= 0) cJSON_AddNumberToObject(o, "bos_token_id", c->bos_token_id);
    if (c->eos_token_id >= 0) cJSON_AddNumberToObject(o, "eos_token_id", c->eos_token_id);
    cJSON_AddStringToObject(o, "torch_dtype", dtype_name(dtype));
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    return text;
}

/* Every parameter under its HF name into one safetensors file. */
ctrl_status ctrl_model_save_weights(ctrl_model *m, const char *path, ctrl_dtype dtype) {
    const int n = ctrl_model_view_count(m);
    ctrl_st_write *tensors = calloc((size_t)n, sizeof *tensors);
    if (!tensors) return ctrl_error_set(CTRL_ERR_NOMEM, "model: out of memory");
    if (m->nf4_w) {
        free(tensors);
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED,
                              "model: the base is held in NF4 (QLoRA): only its adapter is saved");
    }
    const float *params = ctrl_model_params(m, NULL);
    int k = 0;
    for (int i = 0; i < n; i++) {
        const ctrl_param_view *v = ctrl_model_view(m, i);
        if (v->lora) continue; /* the adapters are the adapter's (peft_save.c) */
        tensors[k++] = (ctrl_st_write){.name = v->name,
                                       .data = params + v->offset,
                                       .ndim = v->ndim,
                                       .shape = {v->shape[0], v->shape[1]}};
    }
    /* zero3's streamed push: each layer gathered to this rank as the writer reaches it (save_fetch) */
    ctrl_status st =
        ctrl_safetensors_write_fetched(path, tensors, k, dtype, m->save_fetch ? model_save_fetch : NULL, m);
    free(tensors);
    return st;
}

ctrl_status ctrl_model_save(ctrl_model *m, const char *dir, ctrl_dtype dtype) {
    return ctrl_model_save_sharded(m, dir, dtype, CTRL_DEFAULT_MAX_SHARD);
}

ctrl_status ctrl_model_save_sharded(ctrl_model *m, const char *dir, ctrl_dtype dtype,
                                    int64_t max_shard_bytes) {
    if (dtype != CTRL_F32 && dtype != CTRL_BF16 && dtype != CTRL_F16)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s: a model is saved in fp32, bf16 or fp16, not %s", dir,
                              ctrl_dtype_name(dtype));
    char path[4200], cls[64];
    snprintf(path, sizeof path, "%s", dir); /* with its parents, as os.makedirs */
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(path, 0777);
            *p = '/';
        }
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return ctrl_error_set(CTRL_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    const ctrl_model_config *c = ctrl_model_cfg(m);
    class_name(c, cls, sizeof cls);
    char *text = m->source_config ? model_config_carried(m->source_config, c, cls, dtype_name(dtype)) : NULL;
    if (!text) text = config_json(c, dtype);
    snprintf(path, sizeof path, "%s/config.json", dir);
    ctrl_status st = text ? model_write_text_atomic(path, text)
                          : ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory for config.json", dir);
    free(text);
    if (st != CTRL_OK) return st;
    if (c->num_labels <= 0) { /* transformers writes none for a classifier (it cannot generate) */
        snprintf(path, sizeof path, "%s/generation_config.json", dir);
        if (m->source_generation) {
            st = model_write_text_atomic(path, m->source_generation);
        } else {
            cJSON *g = cJSON_CreateObject();
            if (c->bos_token_id >= 0) cJSON_AddNumberToObject(g, "bos_token_id", c->bos_token_id);
            if (c->eos_token_id >= 0) cJSON_AddNumberToObject(g, "eos_token_id", c->eos_token_id);
            text = cJSON_Print(g);
            cJSON_Delete(g);
            st = text ? model_write_text_atomic(path, text)
                      : ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", path);
            cJSON_free(text);
        }
        if (st != CTRL_OK) return st;
    }
    return model_save_shards(m, dir, dtype, max_shard_bytes);
}
