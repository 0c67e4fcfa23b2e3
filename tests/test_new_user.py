"""Rough edges a new user hits, each pinned by a test: what-ifs as the docs print
them, `--set` typos, budgets the device cannot give, labels of specs with one base
name, the summary `check` prints on a terminal, `explain --list`, `--help`, and
`compile` refusing to overwrite what it should not."""

from __future__ import annotations

import re
from pathlib import Path

from msgen.cli import EXIT_ERRORS, main

ROOT = Path(__file__).resolve().parent.parent
GPT7B = str(ROOT / "specs" / "gpt7b.msl")


def test_a_budget_beyond_the_device_fails_the_estimate_with_both_numbers(capsys):
    # gpt7b's 58 GiB budget on a 32 GiB ascend910a (3 GiB runtime reserve)
    code = main(["estimate", GPT7B, "--set", "cluster.device=ascend910a"])
    err = capsys.readouterr().err
    assert code == EXIT_ERRORS
    assert re.search(
        r"error\[MSL403\]: the budget of 58\.00 GiB .* ascend910a can give: 29\.00 GiB", err
    )
