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
