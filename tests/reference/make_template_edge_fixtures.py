"""Edge cases of the template engine's arithmetic, slicing, searching and sorting that the limits
(issue 15) touched, rendered by jinja2 in the environment transformers builds (sandboxed, trim_blocks,
lstrip_blocks, loop controls, its tojson) -> tests/fixtures/templates/edge_snippets.jsonl, in the
format of snippets.jsonl. Only values that fit ctrl's 64-bit integers; overflows and the size limits,
where ctrl refuses what Python would compute, are hand-written checks in tests/template/.

    python3 tests/reference/make_template_edge_fixtures.py   (jinja2 3.1)
"""
import json
import os

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "fixtures", "templates", "edge_snippets.jsonl")

SNIPPETS = [
    ("int_edges", "{{ 9223372036854775806 + 1 }} {{ -9223372036854775807 - 1 }} {{ (-9223372036854775807 - 1) // 1 }} "
     "{{ (-9223372036854775807 - 1) % -1 }} {{ 9223372036854775807 // -1 }} {{ -7 // 2 }} {{ 7 // -2 }} {{ -7 % -3 }} "
     "{{ 7 % -3 }} {{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 3 ** 39 }} {{ 1 ** 9223372036854775807 }} "
     "{{ (-1) ** 9223372036854775807 }} {{ 0 ** 0 }} {{ 2 ** -1 }} {{ 3037000499 * 3037000499 }}", {}),
    ("big_ints_in_filters", "{% set n = -9223372036854775807 - 1 %}{{ 9007199254740993|int }} "
     "{{ (-9223372036854775807)|abs }} {{ n is divisibleby(-1) }} {{ [n + 1, 1]|sum }} {{ 'nan'|int(5) }}", {}),
    ("slice_steps", "{{ xs[::9223372036854775807] }} {{ xs[::-9223372036854775807] }} {{ xs[-9223372036854775807:] }} "
     "{{ xs[:9223372036854775807:2] }} {{ xs[5:1:-2] }} {{ s[::-2] }} {{ s[1:5] }} {{ s[::3] }} {{ s[-2::-1] }} "
     "{{ s[9223372036854775807:] }}|",
     {"xs": [0, 1, 2, 3, 4, 5, 6], "s": "añb🎉cdé"}),
    ("range_edges", "{{ range(9223372036854775806, 9223372036854775807, 5)|list }} "
     "{{ range(-9223372036854775807, -9223372036854775806)|list }} {{ range(10, 0, -3)|list }} "
     "{{ range(3, 9223372036854775807, 4611686018427387904)|list }} {{ range(5, 5)|list }}", {}),
    ("search", "{{ s.find('é') }} {{ s.rfind('a') }} {{ s.count('a') }} {{ s.count('') }} {{ s.rfind('') }} "
     "{{ s.find('zz') }} {{ 'aaaa'.count('aa') }} {{ 'é' in s }} {{ 'xy' in s }} {{ s.replace('a', '--') }} "
     "{{ s.replace('', '.') }} {{ s.replace('a', '', 1) }}",
     {"s": "bañaéna a"}),
    ("sort_stable", "{{ xs|sort }} {{ xs|sort(reverse=true) }} {{ ws|sort }} {{ d|dictsort }} {{ xs|min }} {{ xs|max }} "
     "{{ [1, 1.0, true]|sort }} {{ [2.5, 1, 3, 1.0]|sort }}",
     {"xs": [5, 3, 9, 1, 3, 7, 2, 8, 6, 4, 0, 11, 10], "ws": ["b", "B", "a", "ab", "", "A"],
      "d": {"z": 1, "b": 2, "y": 3, "a": 4, "c": 5}}),
    ("tojson_indents", "{{ xs|tojson(indent=-1) }}|{{ xs|tojson(indent=0) }}|{{ 5|tojson(indent=100000000) }}|"
     "{{ d|tojson(indent=3) }}", {"xs": [1, [2, {}]], "d": {"a": {"b": []}}}),
    ("indent_widths", "{{ 'a\nb'|indent(-3) }}|{{ 'a\nb'|indent(0, true) }}|{{ 'a'|indent(100000000) }}", {}),
    ("bool_slices_big_floats", "{{ xs[true:] }} {{ xs[::true] }} {{ xs[false:true] }} {{ big }} {{ neg }} "
     "{{ 2.567|round(400) }} {{ -2.5|round(-400) }} {{ 2.5|round(-400) }}",
     {"xs": [1, 2, 3], "big": 1e300, "neg": -1e19}),
    ("repeat_edges", "{{ 'ab' * 0 }}|{{ 'ab' * -5 }}|{{ [1, 2] * -1 }}|{{ 3 * 'x' }}|{{ [] * 9223372036854775807 }}|"
     "{{ '' * 9223372036854775807 }}|", {}),
    # one live `loop` per loop (F9): kept past its iteration it shows the loop's state, not a copy
    ("loop_object", "{% set ns = namespace(l=none, k=[]) %}{% for x in xs if x != 2 %}{% if loop.first %}"
     "{% set ns.l = loop %}{% endif %}{% set ns.k = ns.k + [loop] %}[{{ loop.index }}/{{ loop.length }} "
     "{{ loop.previtem }} {{ loop.nextitem }} {{ loop.first }} {{ loop.last }} {{ loop.revindex0 }}"
     "{% for y in 'ab' %} {{ y }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.previtem }}{% endfor %}]"
     "{% else %}none{% endfor %} {{ ns.l.index }} {{ ns.l.last }} {{ ns.k[0].index }} {{ ns.k|length }}"
     "{% for x in [] %}x{% else %} empty{% endfor %}",
     {"xs": [1, 2, 3, 4]}),
    # split on a long separator (memmem), strip with chars, dict() merging (in n log n)
    ("split_strip_dict", "{{ 'a,,b,,,c'.split(',,') }} {{ ',,'.split(',,') }} {{ 'a,,b,,c'.split(',,', 1) }} "
     "{{ 'a,,b,,c'.rsplit(',,', 1) }} {{ 'xxaxyx'.strip('xy') }}|{{ 'éaé'.strip('é') }}|{{ '  a b  '.split() }} "
     "{{ dict(d, b=5) }} {{ dict(b=1, a=2) }} {{ dict(d) == d }}",
     {"d": {"a": 1, "b": 2, "c": 3}}),
]


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    with open(OUT, "w", encoding="utf-8") as f:
        for name, source, variables in SNIPPETS:
            rec = {"name": name, "template": source, "vars": variables}
            try:
                rec["text"] = env.from_string(source).render(**variables)
            except Exception as e:
                rec["error"] = str(e)
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"{len(SNIPPETS)} snippets -> {OUT}")


if __name__ == "__main__":
    main()
