#!/usr/bin/env python3
"""Chat-template fixtures rendered by transformers (render_jinja_template, the function behind
apply_chat_template), for tests/unit/test_template.c:
- templates/<name>.jinja: the chat templates of Qwen2.5, Qwen3, Llama-3/3.1/3.2, Mistral-7B-Instruct
  v0.3, SmolLM2 and plain ChatML, plus TRL's `{% generation %}` training variants (Qwen2.5, Qwen3,
  Llama-3) that give assistant masks. Sources: ../shared/data/tokenizers (Qwen3, Llama-3), the TRL
  package's chat_templates/ (the others as their model repositories ship them), and the Mistral and
  SmolLM2 strings as published in those models' tokenizer_config.json.
- templates/renders.jsonl: one line per (template, conversation, options): the variables the
  template was given ("vars"), and either the rendered "text" with the byte spans [start, end) that
  generation blocks wrote, or the "error" transformers raised.
- templates/tokens.jsonl: apply_chat_template(tokenize=True, return_assistant_tokens_mask=True) ids
  and masks for the real Qwen3 tokenizer (needs ../shared; skipped otherwise) and the committed
  tiny tokenizer, so tokenizer + template + mask mapping are checked end to end.
Run by hand: python3 tests/reference/make_template_fixtures.py
"""
import json
import os

import trl
from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "templates")
SHARED = os.path.join(HERE, "..", "..", "..", "shared", "data", "tokenizers")
TRL_TEMPLATES = os.path.join(os.path.dirname(trl.__file__), "chat_templates")

CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
           "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
           "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
MISTRAL_V03 = r'''{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS] {"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
'''


def shared_template(name):
    with open(os.path.join(SHARED, name, "tokenizer_config.json"), encoding="utf-8") as f:
        return json.load(f)["chat_template"]


def trl_template(name):
    with open(os.path.join(TRL_TEMPLATES, name + ".jinja"), encoding="utf-8") as f:
        return f.read()


CHATML_TOKENS = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>"}
LLAMA3_TOKENS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
TEMPLATES = {
    "chatml": (CHATML, CHATML_TOKENS),
    "smollm2": (SMOLLM2, {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}),
    "qwen2_5": (trl_template("qwen2_5"), CHATML_TOKENS),
    "qwen2_5_training": (trl_template("qwen2_5_training"), CHATML_TOKENS),
    "qwen3": (shared_template("qwen3"), CHATML_TOKENS),
    "qwen3_training": (trl_template("qwen3_training"), CHATML_TOKENS),
    "llama3": (shared_template("llama3"), LLAMA3_TOKENS),
    "llama3_training": (trl_template("llama3_training"), LLAMA3_TOKENS),
    "llama3_1": (trl_template("llama3_1"), LLAMA3_TOKENS),
    "llama3_2": (trl_template("llama3_2"), LLAMA3_TOKENS),
    "mistral_v0.3": (MISTRAL_V03, {"bos_token": "<s>", "eos_token": "</s>"}),
}

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather at a place, today.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                    "days": {"type": "integer"}}, "required": ["city"]}}}]

CONVERSATIONS = {
    "user": [{"role": "user", "content": "What is 2 + 3?"}],
    "system_user": [{"role": "system", "content": "You are a terse assistant."},
                    {"role": "user", "content": "Name a prime number."}],
    "multi_turn": [{"role": "system", "content": "  Be kind.\n"},
                   {"role": "user", "content": "Hi there!"},
                   {"role": "assistant", "content": "Hello! How can I help?"},
                   {"role": "user", "content": "Tell me a joke about cats."},
                   {"role": "assistant", "content": " Why did the cat sit on the computer?\nTo keep an eye on the mouse. "}],
    "unicode": [{"role": "user", "content": "你好，世界！🎉 Ça va? \t tabs\n\nand newlines  "},
                {"role": "assistant", "content": "很好 👍 — «merci»\n```python\nprint('hi')\n```"}],
    "think_in_content": [{"role": "user", "content": "Is 7 prime?"},
                         {"role": "assistant", "content": "<think>\nCheck divisors 2..2.\n</think>\n\nYes, 7 is prime."},
                         {"role": "user", "content": "And 9?"},
                         {"role": "assistant", "content": "<think>\n3 divides 9.\n</think>\n\nNo."}],
    "reasoning_field": [{"role": "user", "content": "2+2?"},
                        {"role": "assistant", "content": "4", "reasoning_content": "Add them."}],
    "tools": [{"role": "user", "content": "Weather in Paris?"},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"type": "function", "id": "call12345",
                   "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 1}}}]},
              {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "call12345"},
              {"role": "assistant", "content": "It is 21 °C in Paris."}],
    "not_alternating": [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
    "empty_assistant": [{"role": "user", "content": "Say nothing."}, {"role": "assistant", "content": ""}],
}

# (template, conversation) pairs that exercise nothing new or that the model cannot express are skipped.
SKIP = {("llama3", "tools"), ("llama3_training", "tools"), ("chatml", "tools"), ("smollm2", "tools"),
        ("llama3_1", "reasoning_field")}


# Small templates for the interpreter's semantics, rendered by the environment transformers builds.
SNIPPETS = [
    ("whitespace", "a  \n  {% if true %}\n  b\n  {% endif %}\n c {{- ' d ' -}} e\n{# note #}\nf {#- x -#} g", {}),
    ("lstrip_plus", "x\n    {%+ if true %}y{% endif %}\n  {{ 'z' }}\n", {}),
    ("trailing_newline", "line\n", {}),
    ("scoping", "{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = x + i %}{{ x }},{% endfor %}{{ x }}", {}),
    ("namespace", "{% set ns = namespace(n=0, s='') %}{% for i in [3, 1, 2] %}{% set ns.n = ns.n + i %}"
     "{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }}|{{ ns.s }}", {}),
    ("loop_vars", "{% for c in 'héllo' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
     "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}", {}),
    ("loop_filter_else", "{% for x in xs if x > 1 %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}"
     "{% for y in [] %}{{ y }}{% else %}empty{% endfor %}", {"xs": [1, 2, 3, 0, 5]}),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 5 %}{% break %}"
     "{% endif %}{{ x }}{% endfor %}", {}),
    ("slices", "{{ xs[1:] }}{{ xs[:-1] }}{{ xs[::-1] }}{{ xs[::2] }}{{ s[1:4] }}{{ s[-2:] }}{{ s[::-1] }}{{ xs[-1] }}"
     "{{ s[0] }}", {"xs": [1, 2, 3, 4], "s": "añb🎉cd"}),
    ("string_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' x') }}|{{ s.split() }}|"
     "{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ s.upper() }}|"
     "{{ s.lower() }}|{{ 'hello world'.title() }}|{{ 'hELLO'.capitalize() }}|{{ s.replace('x', 'y') }}|"
     "{{ s.startswith('  x') }}{{ s.endswith(('q', 'z  ')) }}|{{ s.find('z') }}|{{ s.count('x') }}|"
     "{{ '-'.join(['a', 'b']) }}", {"s": "  xAyz  "}),
    ("filters", "{{ xs|length }}{{ s|length }}{{ s|trim }}|{{ xs|first }}{{ xs|last }}|{{ xs|join(', ') }}|"
     "{{ xs|reverse|list }}|{{ xs|sort }}|{{ xs|sum }}|{{ xs|min }}{{ xs|max }}|{{ s|upper }}|{{ s|lower }}|"
     "{{ s|replace('b', 'B') }}|{{ undefined_name|default('dflt') }}|{{ ''|default('e', true) }}|"
     "{{ '3'|int + 1 }}|{{ '2.5'|float }}|{{ -3|abs }}|{{ xs|unique|list }}|{{ 7|string + 'x' }}|"
     "{{ 2.567|round(2) }}|{{ s|capitalize }}|{{ 'a<b>'|e }}", {"xs": [3, 1, 2, 1], "s": " ab cd "}),
    ("select", "{{ ms|selectattr('role', 'equalto', 'user')|list|length }}|"
     "{{ ms|rejectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}|"
     "{{ [0, 1, 2, '', 'x']|select|list }}|{{ [1, 2, 3, 4]|select('odd')|list }}|"
     "{{ [1, 2, 3, 4]|reject('even')|list }}|{{ ms|map(attribute='role')|list }}",
     {"ms": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
             {"role": "user", "content": "c"}]}),
    ("tests", "{{ x is defined }}{{ y is defined }}{{ x is string }}{{ n is number }}{{ n is integer }}{{ f is float }}"
     "{{ d is mapping }}{{ xs is iterable }}{{ xs is sequence }}{{ z is none }}{{ b is false }}{{ b is true }}"
     "{{ b is boolean }}{{ n is odd }}{{ n is even }}{{ n is divisibleby 3 }}{{ x is equalto 'a' }}"
     "{{ n is not none }}{{ x is in ['a'] }}{{ 'abc' is lower }}{{ n is gt 2 }}",
     {"x": "a", "n": 3, "f": 1.5, "d": {}, "xs": [1], "z": None, "b": False}),
    ("operators", "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1 + 2 * 3 - 4 }} "
     "{{ 'a' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ [1] + [2] }} {{ 1 < 2 < 3 }} {{ 'b' > 'a' }} {{ 1 == 1.0 }} "
     "{{ 'x' in 'xyz' }} {{ 'k' in d }} {{ 2 not in [1] }} {{ not 0 }} {{ 0 or 'y' }} {{ 1 and 'z' }} "
     "{{ 'yes' if n > 2 else 'no' }} {{ 'only' if false }}|{{ -n }} {{ (1, 2) }} {{ 1.0 }} {{ 0.1 + 0.2 }} "
     "{{ 1e-7 }} {{ 10 / 4 }} {{ 2.0 * 3 }} {{ 1e20 }} {{ 123456789.0 * 1000 }}", {"d": {"k": 1}, "n": 3}),
    ("values", "{{ none }}{{ true }}{{ false }}{{ d }}{{ xs }}{{ s }}{{ nested }}{{ 'it''s' }}{{ \"q\\\"d\" }}"
     "{{ \"it's\" }}{{ 'esc\\n\\t\\x41\\u00e9' }}",
     {"d": {"a": 1, "b": [True, None]}, "xs": ["a", "b'c"], "s": "plain", "nested": [{"k": "v"}]}),
    ("tojson", "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ xs|tojson }}|{{ s|tojson }}|{{ {}|tojson }}|{{ []|tojson(indent=4) }}",
     {"d": {"name": "x", "n": [1, 2.5, None, True], "u": "é\"\n\u0001"}, "xs": [], "s": "ü\\/"}),
    ("dict_methods", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.keys()|list }}{{ d.values()|list }}"
     "{{ d.get('a') }}{{ d.get('zz', 'dflt') }}{{ d.get('zz') }}{% for k in d %}{{ k }}{% endfor %}{{ d|dictsort }}",
     {"d": {"b": 2, "a": 1}}),
    ("macro_setblock", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} "
     "{{ greet('B', '?') }} {{ greet(name='C', punct='.') }}{% set block %}inner {{ 1 + 1 }}{% endset %}[{{ block }}]", {}),
    ("attr_access", "{{ m.role }}{{ m['role'] }}{{ m.missing }}{{ m.content.content }}{{ xs.0 }}{{ m.missing is defined }}"
     "{{ xs[5] is defined }}", {"m": {"role": "user", "content": "hi"}, "xs": ["zero"]}),
    ("raise", "{% if x %}{{ raise_exception('bad input: ' + x) }}{% endif %}", {"x": "oops"}),
    ("undefined_error", "{{ missing.attr }}", {}),
    ("type_error", "{{ 'a' + 1 }}", {}),
    ("indent", "{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}", {}),
]


def render_snippets():
    from transformers.utils.chat_template_utils import _compile_jinja_template
    out = []
    for name, source, variables in SNIPPETS:
        rec = {"name": name, "template": source, "vars": variables}
        try:
            rec["text"] = _compile_jinja_template(source).render(**variables)
        except Exception as e:
            rec["error"] = str(e)
        out.append(rec)
    return out


def byte_spans(text, spans):
    return [[len(text[:s].encode()), len(text[:e].encode())] for s, e in spans]


def render(source, messages, tools, kwargs, add_generation_prompt):
    texts, indices = render_jinja_template(conversations=[messages], tools=tools, chat_template=source,
                                           return_assistant_tokens_mask="generation" in source,
                                           add_generation_prompt=add_generation_prompt, **kwargs)
    return texts[0], (indices[0] if indices else [])


def main():
    os.makedirs(OUT, exist_ok=True)
    lines = []
    for name, (source, special) in TEMPLATES.items():
        with open(os.path.join(OUT, name + ".jinja"), "w", encoding="utf-8") as f:
            f.write(source)
        for conv_name, messages in CONVERSATIONS.items():
            if (name, conv_name) in SKIP:
                continue
            tools = TOOLS if conv_name == "tools" else None
            extras = [{}]
            if name.startswith("qwen3"):
                extras.append({"enable_thinking": False})
            if name.startswith("llama3_"):
                extras = [{"date_string": "26 Jul 2024"}]
                if conv_name == "tools":
                    extras.append({"date_string": "1 Jan 2025", "tools_in_user_message": False})
            for extra in extras:
                for agp in (False, True):
                    kwargs = dict(special, **extra)
                    vars_ = {"messages": messages, "tools": tools, "documents": None, "add_generation_prompt": agp,
                             **kwargs}
                    rec = {"template": name, "conversation": conv_name, "vars": vars_}
                    try:
                        text, spans = render(source, json.loads(json.dumps(messages)), tools, kwargs, agp)
                        rec["text"] = text
                        rec["generation"] = byte_spans(text, spans)
                    except Exception as e:  # the template's raise_exception, or a type error
                        rec["error"] = str(e)
                    lines.append(rec)
    with open(os.path.join(OUT, "renders.jsonl"), "w", encoding="utf-8") as f:
        for rec in lines:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"{len(lines)} renders, {sum('error' in r for r in lines)} errors")
    with open(os.path.join(OUT, "snippets.jsonl"), "w", encoding="utf-8") as f:
        for rec in render_snippets():
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")

    # Token ids and assistant masks: the real Qwen3 tokenizer with TRL's Qwen3 training template, and
    # the committed tiny tokenizer (never skipped) with the Qwen2.5 training template; plus each
    # tokenizer's own template with add_generation_prompt.
    cases = [("qwen3", os.path.join(SHARED, "qwen3"), "qwen3_training"),
             ("tiny_bpe", os.path.join(HERE, "..", "fixtures", "tokenizer", "tiny_bpe"), "qwen2_5_training")]
    with open(os.path.join(OUT, "tokens.jsonl"), "w", encoding="utf-8") as f:
        for tok_name, path, training_name in cases:
            tok = AutoTokenizer.from_pretrained(path)
            training = trl_template(training_name)
            for conv_name in ("multi_turn", "unicode", "think_in_content", "reasoning_field"):
                out = tok.apply_chat_template(CONVERSATIONS[conv_name], chat_template=training, tokenize=True,
                                              return_dict=True, return_assistant_tokens_mask=True)
                f.write(json.dumps({"tokenizer": tok_name, "template": training_name, "conversation": conv_name,
                                    "messages": CONVERSATIONS[conv_name], "input_ids": list(out["input_ids"]),
                                    "assistant_masks": list(out["assistant_masks"])}, ensure_ascii=False) + "\n")
                ids = tok.apply_chat_template(CONVERSATIONS[conv_name], tokenize=True, add_generation_prompt=True)
                ids = ids["input_ids"] if hasattr(ids, "keys") else ids
                f.write(json.dumps({"tokenizer": tok_name, "conversation": conv_name,
                                    "messages": CONVERSATIONS[conv_name], "add_generation_prompt": True,
                                    "input_ids": list(ids)}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
