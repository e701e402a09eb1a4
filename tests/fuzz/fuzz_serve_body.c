/* `ctrl serve` request bodies, through the functions the daemon hands them to: the first byte picks
 * the endpoint (mod 4: /generate, /v1/completions, /v1/chat/completions, /update_weights), the rest
 * is the body. Generation bodies are parsed as the daemon does (a JSON object, else 400) and
 * validated into token-id prompts (serve_input_parse) without generating; /update_weights bodies
 * (safetensors) are validated and applied to the fixture model (docs/fuzzing.md). */
#include <stdio.h>
#include <stdlib.h>

#include "fuzz_common.h"
#include "model/model.h"
#include "serve/serve_internal.h"

#define MODEL_DIR CTRL_FIXTURE_DIR "/trl_sft/model"

static ctrl_serve_options opt;
static ctrl_server server;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    ctrl_serve_options_default(&opt);
    opt.max_seqs = 64; /* prompts x n per request: keeps an input's work small */
    server.opt = &opt;
    if (ctrl_model_load(MODEL_DIR, NULL, &server.model) != CTRL_OK ||
        ctrl_tokenizer_load(MODEL_DIR, &server.tok) != CTRL_OK ||
        ctrl_chat_template_load(server.tok, &server.chat) != CTRL_OK) {
        fprintf(stderr, "fuzz_serve_body: %s\n", ctrl_error_message());
        abort();
    }
    server.context = ctrl_model_cfg(server.model)->max_position_embeddings;
    return 0;
}

static void generation_body(int kind, const char *body, size_t len) {
    cJSON *in = len ? cJSON_ParseWithLength(body, len) : cJSON_CreateObject();
    if (cJSON_IsObject(in)) {
        serve_input input;
        char msg[512];
        msg[0] = '\0';
        const unsigned status = serve_input_parse(&server, in, kind, &input, msg, sizeof msg);
        if (status == 0) {
            free(serve_input_requests(&server, &input));
        } else if (status == 400 && !msg[0]) {
            abort(); /* every 400 names the field */
        }
        serve_input_free(&input);
    }
    cJSON_Delete(in);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const char *body = (const char *)data + 1;
    const size_t len = size - 1;
    static const int kinds[3] = {SERVE_TRL, SERVE_COMPLETIONS, SERVE_CHAT};
    if (data[0] % 4 < 3) {
        generation_body(kinds[data[0] % 4], body, len);
    } else {
        char err[512];
        (void)serve_update_weights(server.model, body, len, err, sizeof err);
    }
    return 0;
}
