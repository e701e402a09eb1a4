#!/usr/bin/env python3
"""Writes tests/fixtures/reward/length.tsv: TRL's reward_len example on a few completions.

TRL's documentation example (GRPOTrainer quick start):
    def reward_len(completions, **kwargs):
        return [-abs(20 - len(completion)) for completion in completions]
generalised here by the target length. Lines: target <TAB> expected score <TAB> completion.
Run by hand: python3 tests/reference/make_reward_fixtures.py
"""
import os

OUT = os.path.join(os.path.dirname(__file__), "..", "fixtures", "reward", "length.tsv")


def reward_len(completions, target):
    return [-abs(target - len(c)) for c in completions]


COMPLETIONS = [
    "",
    "short",
    "exactly twenty chars",
    "The answer is 42 because six times seven is forty-two.",
    "数学很有趣，答案是四十二。",
    "emoji 🎉🎉 party",
    "naïve café résumé",
]


def main():
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        for target in (20, 5):
            for c, s in zip(COMPLETIONS, reward_len(COMPLETIONS, target)):
                f.write("%d\t%d\t%s\n" % (target, s, c))


if __name__ == "__main__":
    main()
