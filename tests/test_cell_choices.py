"""The whole templates model.py and the helper cells choose among
(msgen/emit/ops/cell_choices.py): every choice of a concern is a template that defines
the same hooks, so the template that imports it renders whichever is chosen; a choice
or concern that does not exist is refused when the value is made."""

from __future__ import annotations

import re

import pytest

from msgen.emit.ops.cell_choices import CONCERNS, CellChoices
from msgen.resources import resource_dir

TEMPLATES = resource_dir("templates")
MACRO = re.compile(r"{%-?\s*macro\s+(\w+)\(")
CASES = [(folder, concern) for folder, concerns in CONCERNS.items() for concern in concerns]


def hooks(path) -> set[str]:
    return set(MACRO.findall(path.read_text()))


@pytest.mark.parametrize(("folder", "concern"), CASES)
def test_every_choice_of_a_concern_defines_the_same_hooks(folder, concern):
    choices = CONCERNS[folder][concern]
    found = {choice: hooks(TEMPLATES / folder / concern / f"{choice}.py.j2") for choice in choices}
    first = found[choices[0]]
    assert first, f"{folder}/{concern}/{choices[0]} defines no hook"
    assert all(names == first for names in found.values()), found


@pytest.mark.parametrize("folder", CONCERNS)
def test_the_parent_template_calls_only_hooks_its_choices_define(folder):
    """`ops/attention` -> templates/ops/attention.py.j2, `model` -> templates/model.py.j2:
    every `<alias>.<hook>(` it calls is a hook of the concern it imported as <alias>."""
    text = (TEMPLATES / f"{folder}.py.j2").read_text()
    aliases = dict(re.findall(r'template\("(\w+)"\) as (\w+)', text))
    assert set(aliases) == set(CONCERNS[folder])
    for concern, alias in aliases.items():
        choice = CONCERNS[folder][concern][0]
        defined = hooks(TEMPLATES / folder / concern / f"{choice}.py.j2")
        called = set(re.findall(rf"\b{alias}\.(\w+)\(", text))
        assert called and called <= defined, (concern, called - defined)


def test_a_choice_that_does_not_exist_is_refused():
    with pytest.raises(ValueError, match="flash"):
        CellChoices.of("ops/attention", rope="fused", kernel="flashy", qk_norm="none")
    with pytest.raises(ValueError, match="qk_norm"):
        CellChoices.of("ops/attention", rope="fused", kernel="flash")
    with pytest.raises(ValueError, match="no concern"):
        CellChoices.of("ops/mla", rope="plain", kernel="flash").template("qk_norm")


def test_a_choice_names_its_template():
    cell = CellChoices.of("ops/attention", rope="scaled", kernel="flash", qk_norm="rms")
    assert cell.template("rope") == "ops/attention/rope/scaled.py.j2"
    assert (TEMPLATES / cell.template("kernel")).is_file()
