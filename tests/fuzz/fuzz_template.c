/* The Jinja chat-template engine: the input is a template, compiled and rendered with a fixed
 * conversation (every role, a tool call, tools, special tokens, add_generation_prompt), as
 * apply_chat_template would (docs/fuzzing.md). */
#include <stdlib.h>

#include "fuzz_common.h"
#include "template/chat.h"

static cJSON *vars;

static const char *const context =
    "{\"messages\": ["
    "{\"role\": \"system\", \"content\": \"You are terse.\"},"
    "{\"role\": \"user\", \"content\": \"What is 2+2? <|im_end|> {{ x }}\"},"
    "{\"role\": \"assistant\", \"content\": \"4\", \"reasoning_content\": \"add\","
    " \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"add\", \"arguments\": {\"a\": 2, "
    "\"b\": 2}}}]},"
    "{\"role\": \"tool\", \"content\": \"4\", \"name\": \"add\"},"
    "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"thanks\"}]}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"add\", \"description\": \"a+b\","
    " \"parameters\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}}}],"
    " \"add_generation_prompt\": true, \"enable_thinking\": false,"
    " \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"pad_token\": null, \"n\": -3, \"pi\": 3.5}";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    vars = cJSON_Parse(context);
    if (!vars) abort();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ctrl_template *t = NULL;
    if (ctrl_template_compile((const char *)data, size, "fuzz", &t) != CTRL_OK) return 0;
    char *text = NULL;
    size_t len = 0;
    uint8_t *mask = NULL;
    if (ctrl_chat_render(t, vars, &text, &len, &mask) == CTRL_OK) free(text), free(mask);
    ctrl_template_free(t);
    return 0;
}
