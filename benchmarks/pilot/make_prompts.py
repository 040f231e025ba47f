"""Writes benchmarks/pilot/prompts.jsonl: the self-distill prompts of the train-head pilot.

Every prompt is written here from templates and subjects of our own (public domain, like the
rest of this repository's text); none comes from the bench's prompt sets or from a published
benchmark. They cover the kinds of text the adversarial bench set holds (stories, poems,
dialogue, lists of ideas, letters, opinions, code from a one-line spec) so the head learns what
the target writes there. Run: python benchmarks/pilot/make_prompts.py
"""

from __future__ import annotations

import json
from pathlib import Path

SUBJECTS = [
    "a clockmaker who loses her sense of time", "a dog waiting at a bus stop",
    "the last bookshop in a harbour town", "a robot learning to garden",
    "two sisters crossing a desert", "a forgotten radio station", "a snowstorm in April",
    "an astronaut's first night back on Earth", "a village that moves every winter",
    "a street musician in the rain", "a chess game that lasts forty years",
    "a lost glove on a mountain path", "the night shift at a bakery",
    "a ferry that never arrives", "a child who collects keys",
]
TEMPLATES = [
    "Tell a short story about {s}.\n\n",
    "A poem about {s}, in free verse:\n\n",
    "Describe {s} in vivid detail, as the first chapter of a novel.\n\n",
    "Write a diary entry about {s}.\n\n",
    "A conversation between two friends who are arguing about {s}.\n\nAnna:",
    "Pitch a film about {s} to a producer in three paragraphs.\n\n",
    "Write a children's bedtime story about {s}.\n\n",
]
TOPICS = [
    "working from home", "learning a second language as an adult", "public libraries",
    "self-driving cars", "homework for young children", "four-day work weeks",
    "city parks versus parking space", "social media for teenagers", "cooking at home",
    "keeping a paper notebook", "bicycle lanes", "museums charging for entry",
]
OPINION = [
    "What do you honestly think about {t}? Argue one side clearly.\n\n",
    "List twelve creative ideas related to {t}:\n1.",
    "Write a letter to the editor of a local newspaper about {t}.\n\n",
    "Give the pros and cons of {t}, then your conclusion.\n\n",
]
SPECS = [
    "reverses the order of the words in a sentence",
    "merges two sorted lists into one sorted list",
    "counts the words in a text file and prints the ten most common",
    "converts a temperature between Celsius and Fahrenheit",
    "returns the n-th Fibonacci number with memoization",
    "parses a date written as DD/MM/YYYY and returns the weekday",
    "removes duplicate lines from a file while keeping their order",
    "finds the longest common prefix of a list of strings",
    "validates an email address with a simple rule set",
    "flattens a nested list of any depth",
    "computes the moving average of a list of numbers",
    "groups a list of people by the first letter of their name",
]
CODE = [
    "Write a Python function that {c}.\n\n```python\n",
    "# JavaScript: a function that {c}\n",
]


def prompts() -> list[str]:
    out = [t.format(s=s) for t in TEMPLATES for s in SUBJECTS]
    out += [t.format(t=topic) for t in OPINION for topic in TOPICS]
    out += [t.format(c=spec) for t in CODE for spec in SPECS]
    return out


if __name__ == "__main__":
    path = Path(__file__).with_name("prompts.jsonl")
    with path.open("w", encoding="utf-8") as f:
        for prompt in prompts():
            f.write(json.dumps({"prompt": prompt}) + "\n")
    print(f"{len(prompts())} prompts -> {path}")
