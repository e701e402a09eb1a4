#!/usr/bin/env python3
"""Writes tests/fixtures/reward/accuracy.jsonl for the `accuracy` reward plugin.

Each line: a completion, the row's solution (a JSON string or number, as the dataset column
holds it), `expected` = math_verify's verify(parse(solution), parse(completion)) with its default
extraction (1.0 / 0.0; null when the solution parses to nothing: TRL's None), and `trl` = TRL's own
accuracy_reward on the same pair (stricter: it needs \\boxed or a LaTeX anchor in the completion).
Cases: plain and worded final numbers, GSM8K "####" answers after reasoning with other numbers,
\\boxed answers (nested braces, fractions), negatives, decimals, thousands commas, fractions a/b,
wrong answers, no answer, unparseable solutions. A few hundred, seeded.

    pip install math-verify; python3 tests/reference/make_accuracy_fixtures.py
"""
import json
import os
import random

from math_verify import parse, verify
from trl.rewards import accuracy_reward

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "reward", "accuracy.jsonl")


def cases(rng):
    for _ in range(40):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        c = a + b
        wrong = c + rng.choice([-10, -1, 1, 7])
        for ans in (c, wrong):
            yield f"{ans}", str(c)
            yield f"The answer is {ans}.", str(c)
            yield f"{a} plus {b} makes {ans}", str(c)
            yield f"First {a} + {b}.\nSo the total is {ans}\n#### {ans}", f"{a}+{b}={c}\n#### {c}"
            yield f"We get \\boxed{{{ans}}}", f"\\boxed{{{c}}}"
            yield f"{ans}", c  # the column holds a number
    for _ in range(15):
        p, q = rng.randint(1, 9), rng.randint(2, 12)
        yield f"\\boxed{{\\frac{{{p}}}{{{q}}}}}", f"\\frac{{{p}}}{{{q}}}"
        yield f"so it is {p}/{q}", f"\\frac{{{p}}}{{{q}}}"
        yield f"\\boxed{{\\frac{{{p}}}{{{q + 1}}}}}", f"\\frac{{{p}}}{{{q}}}"
    for _ in range(15):
        x = rng.randint(-500, -1)
        yield f"The result is {x}", str(x)
        yield f"The result is {-x}", str(x)
        d = rng.randint(1, 99) / 4
        yield f"{d:.2f}", f"{d}"
        big = rng.randint(1000, 999999)
        yield f"in all {big:,} apples", str(big)
    yield "I don't know", "42"
    yield "", "42"
    yield "no idea", "7"
    yield "42", "no answer here"
    yield "42", ""


def main():
    rng = random.Random(1234)
    rows = []
    for completion, solution in cases(rng):
        gold = parse(str(solution))
        expected = float(verify(gold, parse(completion))) if gold else None
        trl = accuracy_reward([[{"content": completion}]], [str(solution)])[0]
        rows.append({"completion": completion, "solution": solution, "expected": expected, "trl": trl})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(len(rows), "cases;", sum(r["expected"] == 1.0 for r in rows), "correct,",
          sum(r["expected"] is None for r in rows), "without a parseable solution")


if __name__ == "__main__":
    main()
