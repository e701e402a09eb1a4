#!/usr/bin/env python3
"""Writes tests/fixtures/reward/regex.json for the `format` and `regex` reward plugins.

Expected scores come from Python itself: TRL's think_format_reward for the default `format`, and
re.match / re.search / re.fullmatch / re.findall with the same flags for the other settings. The
file holds the settings (one [reward.NAME] section each) and, per completion, every score.

    python3 tests/reference/make_regex_reward_fixtures.py
"""
import json
import os
import re

from trl.rewards import think_format_reward

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "reward", "regex.json")

COMPLETIONS = [
    "<think>\nThis is my reasoning.\n</think>\nThis is my answer.",
    "<think>\nThis is my reasoning.\nThis is my answer.",
    "<think>a</think><think>b</think>",
    "prefix <think>x</think> answer",
    "<think></think>",
    "<think>思考 🎉</think>答案是 42",
    "The answer is 42. Then 7, and 13.",
    "ANSWER: yes\nanswer: no",
    "",
    "no digits here",
    "<answer>12</answer>",
    "line one\n<answer>\n3\n</answer>\nend",
]

# name -> (plugin, INI options, python scorer)
SETTINGS = {
    "think": ("format", {}, lambda c: think_format_reward([[{"content": c}]])[0]),
    "answer_tag": ("format", {"pattern": r"<answer>.*?</answer>", "mode": "search", "dotall": "true",
                              "multiline": "false"},
                   lambda c: 1.0 if re.search(r"<answer>.*?</answer>", c, re.DOTALL) else 0.0),
    "full": ("format", {"pattern": r"<think>.*</think>", "mode": "fullmatch", "dotall": "false",
                        "multiline": "false"},
             lambda c: 1.0 if re.fullmatch(r"<think>.*</think>", c) else 0.0),
    "has_number": ("regex", {"pattern": r"\d+", "score": "0.5", "else_score": "-1"},
                   lambda c: 0.5 if re.search(r"\d+", c) else -1.0),
    "numbers": ("regex", {"pattern": r"\d+", "count": "true", "score": "0.25"},
                lambda c: 0.25 * len(re.findall(r"\d+", c)) if re.findall(r"\d+", c) else 0.0),
    "answer_line": ("regex", {"pattern": r"^answer: \w+$", "multiline": "true", "ignore_case": "true",
                              "count": "true"},
                    lambda c: float(len(re.findall(r"^answer: \w+$", c, re.M | re.I)))),
    "empty_matches": ("regex", {"pattern": r"x*", "count": "true"},
                      lambda c: float(len(re.findall(r"x*", c)))),
}


def main():
    out = {"settings": {k: {"plugin": p, "options": o} for k, (p, o, _) in SETTINGS.items()},
           "cases": [{"completion": c, "expected": {k: f(c) for k, (_, _, f) in SETTINGS.items()}}
                     for c in COMPLETIONS]}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    print(len(COMPLETIONS), "completions x", len(SETTINGS), "settings")


if __name__ == "__main__":
    main()
