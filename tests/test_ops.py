"""Every op of the library carries what adding it asks for and nothing more: a numpy
reference beside its tests (tests/test_op_*.py), the imports its code needs (its
module's `imports`), and code that computes what the reference does.

- Each op kind has exactly one reference, and each reference is of an op kind.
- Each op's declared import lines parse, and bind every name its generated code and
  its helper cells use that model.py's shell does not define: checked op by op, so
  another op's imports cannot hide a missing one (ruff checks whole files).
- Each op's generated call, run in MindSpore (CPU) inside the compiled tiny specs'
  cells on random operands, equals its reference: a wrong reference or wrong code
  shows up at the op, not only in the loss.
"""

from __future__ import annotations

import ast
import builtins

import numpy as np
import pytest

from msgen.emit.build import build_context
from msgen.emit.imports import block
from msgen.emit.ops import EMITTERS
from msgen.emit.ops.cell_choices import CONCERNS as CELL_CONCERNS
from msgen.emit.ops.cell_choices import CellChoices
from msgen.ops import OPS
from msgen.ops.imports import SHELL, bound, parse
from msgen.ops.rope_scaling import frequencies_source
from msgen.resources import template
from tests import reference_numpy as ref
from tests.emit_fixtures import SPECS, TINY, compiled, load, network_class, plan, plan_json

STD = 0.5  # operands and weights large enough that every op's output moves


def test_every_op_has_one_reference_and_every_reference_an_op():
    assert sorted(ref.references()) == sorted(OPS)


@pytest.mark.parametrize("kind", sorted(OPS))
def test_every_op_declares_import_lines_that_parse(kind):
    op = OPS[kind]
    assert op.imports, f"{kind} declares no imports"
    for line in (*op.imports, *(line for lines in op.setting_imports.values() for line in lines)):
        assert parse(line)


def test_an_import_line_that_is_not_one_is_refused():
    for line in ("numpy as np", "from numpy", "import numpy as", "from x import a b"):
        with pytest.raises(ValueError, match="not an import line"):
            parse(line)


def test_the_block_merges_and_sorts_as_isort_does():
    lines = (
        "from mindspore import ops, Tensor",
        "import numpy as np",
        "from functools import wraps",
        "from mindspore import nn, Tensor",
        "import mindspore as ms",
        "from functools import cache",
        "from mindspore.common import dtype as mstype",
    )
    assert block(lines) == (
        "from functools import cache, wraps\n"
        "\n"
        "import mindspore as ms\n"
        "import numpy as np\n"
        "from mindspore import Tensor, nn, ops\n"
        "from mindspore.common import dtype as mstype"
    )


def names(source: str) -> tuple[set[str], set[str]]:
    """(names read, names defined) anywhere in Python source."""
    read, defined = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else defined).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
    return read, defined


def fragment(helper: str, values: dict) -> str:
    return template(f"ops/{helper}.py.j2").render(**values)


def shell_names(name: str) -> set[str]:
    """What model.py defines itself, outside the op fragments (weight, COMPUTE_DTYPE, ...)."""
    tree = ast.parse((compiled(name) / "model.py").read_text())
    top = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    top |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets}
    helpers = {h for emitter in EMITTERS.values() for h in emitter.helpers}
    every = {
        "dropout": True,
        "permute": True,
        "biased": True,
        "rope_frequencies": frequencies_source(),
    }  # all a fragment can define, with each concern's last (fullest) choice
    fullest = {
        folder[4:]: {"cell": CellChoices.of(folder, **{c: cs[-1] for c, cs in concerns.items()})}
        for folder, concerns in CELL_CONCERNS.items()
        if folder.startswith("ops/")
    }
    return top - set().union(*(names(fragment(h, every | fullest.get(h, {})))[1] for h in helpers))


@pytest.mark.parametrize("name", TINY)
def test_each_op_imports_what_its_code_uses(name):
    ctx = build_context(plan(name), str(SPECS[name]))
    shell = shell_names(name) | bound(SHELL) | set(dir(builtins))
    for op in ctx.ops():
        snippet = EMITTERS[op.kind].code(op, ctx)
        sources = [snippet.make, snippet.call]
        values = EMITTERS[op.kind].helper_values([op])  # what emit renders the fragment with
        sources += [fragment(snippet.helper, values)] if snippet.helper else []
        read, defined = set(), set()
        for source in sources:
            r, d = names(source)
            read, defined = read | r, defined | d
        locals_ = {"self", "labels", *(i for i in op.inputs if isinstance(i, str))}
        missing = read - defined - locals_ - shell - bound(OPS[op.kind].imports_of(op))
        assert not missing, f"{name}: {op.kind} `{op.name}` uses {sorted(missing)} unimported"


def network(name: str):
    """The compiled spec's network in evaluation mode, weights drawn with STD."""
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    net = network_class(load(compiled(name), "model"), plan_json(name))()
    net.set_train(False)
    rng = np.random.default_rng(0)
    for p in net.get_parameters():
        p.set_data(ms.Tensor(rng.normal(0.0, STD, p.shape).astype(np.float32)))
    return net


def operands(node, shapes, tokens: str, vocab: int, rng) -> list:
    """Random values for an op's tensor operands: token ids for the network's input."""
    return [
        (
            rng.integers(0, vocab, shapes[r.name], np.int32)
            if r.name == tokens
            else rng.normal(0.0, STD, shapes[r.name])
        )
        for r in node.inputs
    ]


@pytest.mark.parametrize("name", TINY)
def test_each_op_computes_its_reference(name):
    """Each op's `call`, as model.py writes it, evaluated with `self` the cell that
    holds the op (the network, or the first copy of its layer) and its operands'
    names bound to random tensors."""
    import mindspore as ms

    from msgen.analysis.facts import context

    the_plan = plan(name)
    ctx = build_context(the_plan, str(SPECS[name]))
    net = network(name)
    params = {p.name: p.asnumpy().astype(np.float64) for p in net.get_parameters()}
    tokens, vocab = ctx.network.input, ctx.vocab
    rng = np.random.default_rng(1)
    labels = rng.integers(0, vocab, the_plan.graph("network").shapes[tokens], np.int32)
    cells = [("network", net, "", ctx.network.ops)]
    cells += [
        (lay.name, getattr(net, lay.name)[0], f"{lay.name}.0.", lay.ops) for lay in ctx.layers
    ]
    for graph, cell, prefix, ops in cells:
        facts = the_plan.graph(graph)
        for op in (op for op in ops if op.kind != "repeat"):
            node = facts.ops[op.name].node
            values = operands(node, facts.shapes, tokens, vocab, rng)
            scope = {
                r.name: ms.Tensor(v if v.dtype == np.int32 else v.astype(np.float32))
                for r, v in zip(node.inputs, values)
            }
            scope |= {"self": cell, "labels": ms.Tensor(labels)}
            got = eval(EMITTERS[op.kind].code(op, ctx).call, {}, scope)
            call = ref.Call(node, values, params, prefix, context(the_plan.spec), labels)
            want = ref.references()[op.kind](call)
            pairs = [(got, want)]
            if isinstance(want, ref.WithAux):  # (output, auxiliary loss)
                pairs = list(zip(got, want, strict=True))
            for got, want in pairs:
                np.testing.assert_allclose(
                    got.asnumpy(),
                    want,
                    rtol=1e-4,
                    atol=1e-5 * max(1.0, np.abs(want).max()),
                    err_msg=f"{name}: {op.kind} `{graph}.{op.name}`",
                )


def test_the_checks_reserve_every_name_an_op_may_import():
    """Names that only some models import (flash's, lazy_inline's) are reserved
    whatever the spec: the checks read every op's declared imports, not a template."""
    from msgen.checks.reserved import class_clash, reserved_reason

    assert "hide a name" in class_clash("flash_attention_score")
    assert "hide a name" in class_clash("global_comm")
    for name in ("np", "ms", "cache", "wraps", "lazy_inline", "mstype"):
        assert reserved_reason(name) == "the generated code already uses it", name
