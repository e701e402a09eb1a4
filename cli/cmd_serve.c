/* ctrl serve: parses the flags into ctrl_serve_options and runs the server module (core/serve/,
 * where the endpoints, limits and timeouts are described). */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <cJSON.h>

#include "cli.h"
#include "hub_cache.h"
#include "serve/serve.h"

/* A whole number in [lo, hi] from a flag's value; -1 when it is not one. */
static int whole(const char *v, long lo, long hi, long *out) {
    char *end = NULL;
    const long x = strtol(v, &end, 10);
    if (!*v || *end || x < lo || x > hi) return -1;
    *out = x;
    return 0;
}

static int run_serve(ctrl_cli *cli, int argc, char **argv) {
    ctrl_serve_options o;
    ctrl_serve_options_default(&o);
    o.api_key = getenv("CTRL_API_KEY");
    const char *rt = getenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING"); /* vLLM's switch for the same routes */
    o.runtime_lora = rt && (!strcmp(rt, "1") || !strcasecmp(rt, "true"));
    long kv_mb = (long)(o.kv_cache_bytes >> 20), body_kb = (long)(o.max_body >> 10);
    int wtc = 0; /* --weight-transfer-config given */
    static const struct {
        const char *flag;
        long lo, hi;
    } ints[] = {{"--port", 1, 65535},
                {"--kv-cache-mb", 1, 1L << 24},
                {"--max-body-kb", 1, 1L << 22},
                {"--max-seqs-per-request", 1, 1L << 20},
                {"--max-queued-seqs", 1, 1L << 24},
                {"--prefill-chunk", 0, INT_MAX},
                {"--timeout-s", 1, 86400},
                {"--max-connections", 1, 65536},
                {"--max-connections-per-ip", 0, 65536},
                {"--drain-s", 0, 86400},
                {"--weight-transfer-timeout-s", 1, 86400}};
    int *const dst[] = {&o.port,
                        NULL,
                        NULL,
                        &o.max_seqs,
                        &o.max_queued,
                        &o.prefill_chunk,
                        &o.timeout_s,
                        &o.max_connections,
                        &o.max_per_ip,
                        &o.drain_s,
                        &o.weight_transfer_timeout_s};
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--allow-runtime-lora-updating")) { /* a switch: no value */
            o.runtime_lora = 1;
            continue;
        }
        if (!v) return cli_usage_error(&cli_cmd_serve, "%s needs a value", k);
        i++;
        size_t f = 0;
        while (f < sizeof ints / sizeof ints[0] && strcmp(k, ints[f].flag)) f++;
        if (f < sizeof ints / sizeof ints[0]) {
            long x;
            if (whole(v, ints[f].lo, ints[f].hi, &x))
                return cli_usage_error(&cli_cmd_serve, "%s %s: a whole number between %ld and %ld", k, v,
                                       ints[f].lo, ints[f].hi);
            if (dst[f]) *dst[f] = (int)x;
            if (f == 1) kv_mb = x;
            if (f == 2) body_kb = x;
        } else if (!strcmp(k, "--model")) {
            static char resolved[4096]; /* a Hub id: the local cache's snapshot */
            o.model_dir = ctrl_hub_resolve(v, resolved, sizeof resolved);
        } else if (!strcmp(k, "--host")) {
            o.host = v;
        } else if (!strcmp(k, "--kv-cache-dtype") && (!strcmp(v, "fp32") || !strcmp(v, "bf16"))) {
            o.kv_cache_dtype = !strcmp(v, "bf16");
        } else if (!strcmp(k, "--kv-cache-dtype")) {
            return cli_usage_error(&cli_cmd_serve, "--kv-cache-dtype %s: fp32 or bf16", v);
        } else if (!strcmp(k, "--dtype") && (!strcmp(v, "fp32") || !strcmp(v, "bf16"))) {
            o.bf16 = !strcmp(v, "bf16");
        } else if (!strcmp(k, "--dtype")) {
            return cli_usage_error(&cli_cmd_serve, "--dtype %s: fp32 or bf16", v);
        } else if (!strcmp(k, "--lora") || !strcmp(k, "--lora-modules")) { /* NAME=DIR, repeatable */
            const char *eq = strchr(v, '=');
            if (!eq || eq == v || !eq[1])
                return cli_usage_error(&cli_cmd_serve, "%s %s: NAME=DIR (an adapter directory)", k, v);
            if (o.n_lora == CTRL_SERVE_MAX_LORA)
                return cli_usage_error(&cli_cmd_serve, "%s: at most %d adapters", k, CTRL_SERVE_MAX_LORA);
            char *name = strndup(v, (size_t)(eq - v));
            for (int j = 0; name && j < o.n_lora; j++)
                if (!strcmp(o.lora_name[j], name)) {
                    free(name);
                    return cli_usage_error(&cli_cmd_serve, "%s %s: the name is given twice", k, v);
                }
            o.lora_name[o.n_lora] = name, o.lora_dir[o.n_lora++] = eq + 1;
        } else if (!strcmp(k, "--api-key")) {
            o.api_key = v;
        } else if (!strcmp(k, "--device")) {
            o.device = v; /* checked when the server starts (ctrl_device_select names what is wrong) */
        } else if (!strcmp(k, "--weight-transfer-config")) { /* vLLM's flag, which TRL's errors name */
            /* the NCCL engine is always there on a CUDA device: only its own configuration is accepted */
            cJSON *j = cJSON_Parse(v);
            const cJSON *be = cJSON_GetObjectItemCaseSensitive(j, "backend");
            const int ok = cJSON_IsObject(j) && cJSON_GetArraySize(j) == 1 && cJSON_IsString(be) &&
                           !strcmp(be->valuestring, "nccl");
            cJSON_Delete(j);
            wtc = 1;
            if (!ok)
                return cli_usage_error(
                    &cli_cmd_serve,
                    "--weight-transfer-config %s: ctrl serve's engine is NCCL's: '{\"backend\": "
                    "\"nccl\"}' (it needs --device cuda), see docs/serve.md",
                    v);
        } else {
            return cli_usage_error(&cli_cmd_serve, "unexpected argument '%s'", k);
        }
    }
    if (!o.model_dir) return cli_usage_error(&cli_cmd_serve, "needs --model DIR");
    if (wtc && !strcmp(o.device, "cpu"))
        return cli_usage_error(&cli_cmd_serve,
                               "--weight-transfer-config: the NCCL engine needs --device cuda");
    for (int j = 0; j < o.n_lora; j++)
        if (!strcmp(o.lora_name[j], o.model_dir))
            return cli_usage_error(&cli_cmd_serve, "--lora %s: the name is the served model's own",
                                   o.lora_name[j]);
    unsigned char addr[4];
    if (sscanf(o.host, "%hhu.%hhu.%hhu.%hhu", &addr[0], &addr[1], &addr[2], &addr[3]) != 4)
        return cli_usage_error(&cli_cmd_serve, "--host %s: not an IPv4 address", o.host);
    o.kv_cache_bytes = (size_t)kv_mb << 20, o.max_body = (size_t)body_kb << 10;
    if (o.api_key && !o.api_key[0]) o.api_key = NULL;
    ctrl_registry *reg = NULL;
    ctrl_status st = cli_plugins(cli, &reg);
    if (st == CTRL_OK) st = ctrl_serve_run(&o, reg, cli_interrupted);
    for (int j = 0; j < o.n_lora; j++) free((char *)o.lora_name[j]);
    return st == CTRL_OK ? 0 : cli_fail(st);
}

const ctrl_command cli_cmd_serve = {
    .name = "serve",
    .summary =
        "serve generation over HTTP (OpenAI completions and chat as vLLM serves them, TRL's VLLMClient "
        "with vLLM's NCCL weight sync on a GPU, ctrl's /generate and /update_weights)",
    .usage =
        "usage: ctrl serve --model DIR [--host 127.0.0.1] [--port 8000] [--kv-cache-mb 256]\n"
        "                  [--dtype fp32|bf16] [--kv-cache-dtype fp32|bf16] [--api-key KEY]\n"
        "                  [--max-body-kb 1024] [--max-seqs-per-request 4096] [--max-queued-seqs 16384]\n"
        "                  [--prefill-chunk 512] [--timeout-s 30] [--max-connections 512]\n"
        "                  [--max-connections-per-ip 256] [--drain-s 60]\n"
        "                  [--lora NAME=DIR ...] [--allow-runtime-lora-updating]\n"
        "                  [--device cpu|cuda|auto] [--weight-transfer-config '{\"backend\": \"nccl\"}']\n"
        "                  [--weight-transfer-timeout-s 300]\n\n"
        "GET /health, GET /v1/models, /server_info, /get_world_size; POST /generate {\"prompts\": [...] |\n"
        "\"prompt_token_ids\": [[...]], n, temperature, top_p, top_k, min_p, repetition_penalty,\n"
        "presence_penalty, frequency_penalty, max_tokens, seed} -> {prompt_ids, completion_ids, logprobs};\n"
        "POST /v1/completions {prompt, ...} and /v1/chat/completions {messages, ...} as vLLM serves them\n"
        "(stop, logprobs, top_logprobs, prompt_logprobs, echo, return_token_ids, stream with\n"
        "stream_options; TRL's VLLMClient works against it); POST /update_weights (a safetensors body of\n"
        "some or all parameters, validated whole before any weight changes); POST /sleep\n"
        "{\"level\": 1|2}, /wake_up, /reset_prefix_cache. Requests without a seed get a fresh one.\n"
        "Errors are OpenAI's {\"error\": {message, type, param, code}}. Every invalid field (wrong JSON\n"
        "type, out of range, unknown or unsupported) is a 400 naming it; prompts x n\n"
        "above --max-seqs-per-request and prompt + max_tokens beyond the model's context (or the KV\n"
        "cache) are 400; a request that would make more than --max-queued-seqs sequences queued or\n"
        "running 503; bad JSON 400, oversized bodies 413, a missing or wrong API key 401 (--api-key or\n"
        "CTRL_API_KEY: Authorization: Bearer KEY on everything but /health).\n"
        "A prompt prefills at most --prefill-chunk tokens per engine step (0: no limit), interleaved\n"
        "with the other requests' decoding. Connections idle for --timeout-s, and request bodies not\n"
        "received within it, are closed. Binds to 127.0.0.1 unless --host says otherwise.\n"
        "A client that disconnects cancels its generation (streamed or not).\n"
        "--dtype bf16 (vLLM's --dtype bfloat16): the linear layers and the LM head compute in bf16\n"
        "(fp32 accumulation, as torch.autocast) on weights packed to bf16 at the first step and again\n"
        "after /update_weights changes them; the KV cache is then bf16 unless --kv-cache-dtype says fp32.\n"
        "SIGINT/SIGTERM drain: /health answers 503 and new generations are refused (503) while the\n"
        "requests in flight finish for at most --drain-s seconds; the rest are answered 503; then the\n"
        "server exits 0.\n"
        "--lora NAME=DIR (repeatable; vLLM's --lora-modules): a PEFT LoRA adapter served over the base,\n"
        "chosen by a request's \"model\": NAME (listed in /v1/models); requests for different adapters\n"
        "and the base are batched in the same engine steps. --allow-runtime-lora-updating (or vLLM's\n"
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True): POST /v1/load_lora_adapter {lora_name, lora_path} and\n"
        "/v1/unload_lora_adapter {lora_name} add and remove adapters while serving (else 404); requests\n"
        "running under an unloaded adapter finish under it.\n"
        "--device cuda runs the model and its KV cache on the GPU (device 0: CUDA_VISIBLE_DEVICES picks "
        "it).\n"
        "There, vLLM's NCCL weight-transfer engine answers as TRL's VLLMClient drives it "
        "(init_communicator,\n"
        "update_named_param, update_model_params): POST /init_weight_transfer_engine {init_info} joins the\n"
        "trainer's group (its TCPStore rendezvous, NCCL loaded from libnccl.so.2 or CTRL_NCCL_LIBRARY),\n"
        "/start_weight_update, /update_weights {update_info: names, dtype_names, shapes[, packed]} receives\n"
        "the broadcast tensors, /finish_weight_update flushes the prefix cache; an update that makes no\n"
        "progress for --weight-transfer-timeout-s seconds is aborted. See docs/serve.md.\n",
    .run = run_serve,
};
