"""The README's "The core from Python" examples run as written and give
what their comments say."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_core_examples_run_and_answer_as_commented():
    text = README.read_text()
    section = text.split("## The core from Python", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2
    names: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), names)  # noqa: S102 - the README's own code
    assert names["scores"].scores == {1: 64}
    assert names["scores"].tiers == {1: (64, 0, 0)}
    decision = names["decision"]
    assert decision.decode_worker == 1
    assert decision.explanation.reason.startswith("worker 1 has the lowest cost (")
    assert names["router"].stats().decisions == [(1, "decode", 1)]
