"""Causal flash attention computes only the causal band on Ascend; elsewhere the composed
path runs unchanged. The device is read by the generated Attention cell, so the Ascend
case is instantiated with MindSpore's device_target reported as Ascend (nothing runs)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.emit_fixtures import compiled, load, network_class, plan, plan_json

FLASH = ("llama13b", "tiny_mixed")  # causal flash attention; tiny_mixed also has dropout


def attention_cells(name: str):
    from mindspore.nn.utils import no_init_parameters

    with no_init_parameters():
        network = network_class(load(compiled(name), "model"), plan_json(name))()
    return [c for _, c in network.cells_and_names() if type(c).__name__ == "Attention"]


@pytest.mark.parametrize("name", FLASH)
def test_causal_flash_attention_runs_the_band_on_ascend(monkeypatch, name):
    import mindspore as ms

    get_context = ms.get_context
    monkeypatch.setattr(
        ms, "get_context", lambda key: "Ascend" if key == "device_target" else get_context(key)
    )
    cells = attention_cells(name)
    assert cells
    for cell in cells:
        assert cell.flash and cell.causal
        attrs = cell.attend.attrs
        # sparse_mode 2 (leftUpCausal): the kernel skips the blocks above the diagonal;
        # the defaults (sparse_mode 0, next_tokens 2**31 - 1) would compute them. A
        # sliding window (tiny_mixed: 24) is the band mode, sparse_mode 4, the window - 1
        # keys before each query and none after.
        window = plan(name).spec.layers["block" if name == "tiny_mixed" else "decoder"]
        window = next(n.args.get("window") for n in window.ops if n.kind == "attention")
        if window:
            assert (attrs["sparse_mode"], attrs["pre_tokens"]) == (4, window - 1)
        else:
            assert attrs["sparse_mode"] == 2
        assert attrs["next_tokens"] == 0
        mask = cell.flash_mask.asnumpy()
        assert mask.dtype == np.uint8
        assert (mask == np.triu(np.ones((2048, 2048), np.uint8), 1)).all()
        assert not hasattr(cell, "mask")  # the composed path's [seq, seq] mask is not built
    assert len({id(c.flash_mask) for c in cells}) == 1  # one mask shared by every layer


@pytest.mark.parametrize("name", FLASH)
def test_elsewhere_the_composed_path_runs(name):
    for cell in attention_cells(name):
        assert not cell.flash and not hasattr(cell, "attend")
        seq = plan(name).spec.model.dims["seq"]
        assert cell.mask.shape == (cell.size * seq, seq)  # the additive causal mask


def test_flash_evaluation_runs_without_dropout(monkeypatch):
    """The flash kernel's keep_prob is fixed when it is built, so evaluation needs a
    kernel of its own with keep_prob 1.0, chosen when the cell is not training, as the
    composed path skips its dropout then (tiny_mixed: flash with attention dropout)."""
    import ast
    import inspect

    import mindspore as ms

    get_context = ms.get_context
    monkeypatch.setattr(
        ms, "get_context", lambda key: "Ascend" if key == "device_target" else get_context(key)
    )
    cells = attention_cells("tiny_mixed")
    for cell in cells:
        assert cell.p > 0
        assert cell.attend.attrs["keep_prob"] == 1.0
        assert cell.attend_dropout.attrs["keep_prob"] == pytest.approx(1.0 - cell.p)
    construct = ast.parse(
        inspect.getsource(type(cells[0]).construct).strip().replace("\n    ", "\n")
    )

    def guards(node: ast.AST) -> list[str]:
        """The conditions the dropout kernel's call is nested in, outermost first."""
        for child in ast.iter_child_nodes(node):
            if "self.attend_dropout(" in ast.unparse(child):
                inner = guards(child)
                in_body = isinstance(child, ast.If) and any(
                    "self.attend_dropout(" in ast.unparse(b) for b in child.body
                )
                return ([ast.unparse(child.test)] if in_body else []) + inner
        return []

    found = guards(construct)
    assert found and "self.training" in found[-1], found
