"""The MindSpore backend's per-op emission registry (msgen/emit/ops): one emitter per op
of the library and no other, each helper cell it names a fragment in templates/ops/,
and the op library free of emission (its ops declare no code, settings or helper
values: a second backend registers its own emitters over the same ops)."""

from __future__ import annotations

import pytest

from msgen.emit.ops import EMITTERS, OpEmitter
from msgen.ops import OPS
from msgen.ops.base import OpDef
from msgen.resources import resource_dir


def test_every_op_has_one_emitter_and_every_emitter_an_op():
    assert sorted(EMITTERS) == sorted(OPS)
    assert all(EMITTERS[kind].op is OPS[kind] for kind in OPS)


@pytest.mark.parametrize("kind", sorted(EMITTERS))
def test_each_helper_cell_is_a_fragment(kind):
    for helper in EMITTERS[kind].helpers:
        assert (resource_dir("templates") / "ops" / f"{helper}.py.j2").is_file(), helper


def test_the_op_library_declares_no_emission():
    emission = {"code", "settings", "helper_values", "helpers"}
    for cls in (OpDef, *(type(op) for op in OPS.values())):
        assert not emission & set(vars(cls)), cls.__name__
    assert emission - {"helpers"} <= set(vars(OpEmitter))


def test_strategies_as_keyword_arguments_in_the_roles_order():
    """The one helper mla's, moe's, attention's and the norms' code pass their
    strategies through: `, role=strategy` per role asked for, in that order."""
    from msgen.emit.context import OpSpec
    from msgen.emit.ops import strategy_keywords

    op = OpSpec(
        "n", "rmsnorm", ("x",), strategies=(("norm", ((2, 1),)), ("kernel", ((2, 1), (1,))))
    )
    assert strategy_keywords(op, ("kernel", "norm")) == ", kernel=((2, 1), (1,)), norm=((2, 1),)"
    assert strategy_keywords(op, ()) == ""
    with pytest.raises(ValueError, match="no 'flash' strategy"):
        strategy_keywords(op, ("flash",))
