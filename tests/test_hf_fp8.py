"""FP8 block-quantized checkpoints (DeepSeek-V3's published form) through `ckpt from-hf`,
held against torch: every float8_e4m3fn code decodes as torch's `.float()` does; a
weight quantized by torch in DeepSeek's block scheme (ragged edge blocks) dequantizes
to torch's `q.float() * scale_inv` per block, bit for bit; a tiny DeepseekV3 of
transformers 4.57 whose linear weights are stored FP8 with `<name>_scale_inv`
converts to the checkpoint its dequantized fp32 weights convert to (whole and per
rank), and the generated model's logits equal transformers' on those weights (fp32,
1e-4); to-hf writes the dequantized floats and a config without quantization_config.
A checkpoint that is not what its config says is one line, exit 2."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from msgen.hf.fp8 import E4M3FN, dequantize
from msgen.hf.tensors import encode, from_float32, read_header, read_tensor
from tests.oracles import require
from tests.test_ckpt_hf import SEQ, compiled_network, msgen
from tests.test_hf_deepseek import SLICED, hf_model, logits_error
from tests.test_import_hf import CONFIGS, estimate, imported

torch = require("torch")
transformers = require("transformers")
ms = require("mindspore")
safetensors_torch = require("safetensors.torch")

# small blocks so the tiny model's weights have several, most of them ragged (64 rows
# are 24 + 24 + 16), and grids that are not square
BLOCK = [24, 40]
QUANTIZATION = {
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": BLOCK,
}


def quantize(w: torch.Tensor, block) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's block scheme as transformers 4.57 quantizes
    (quantizer_finegrained_fp8.py, create_quantized_param: scale = 448 / amax per
    block, q = clamp(w * scale) as float8_e4m3fn, scale_inv = 1 / scale), the edge
    blocks ragged (padded with zeros, then cut)."""
    (r, c), (bm, bn) = w.shape, block
    grid = (-(-r // bm), -(-c // bn))
    padded = torch.zeros(grid[0] * bm, grid[1] * bn)
    padded[:r, :c] = w.float()
    blocks = padded.view(grid[0], bm, grid[1], bn)
    fmax = torch.finfo(torch.float8_e4m3fn).max
    scale = fmax / blocks.abs().amax(dim=(1, 3))
    q = torch.clamp(blocks * scale[:, None, :, None], -fmax, fmax).to(torch.float8_e4m3fn)
    return q.view(grid[0] * bm, grid[1] * bn)[:r, :c].contiguous(), scale.reciprocal()


def torch_dequant(q: torch.Tensor, scale_inv: torch.Tensor, block) -> torch.Tensor:
    (r, c), (bm, bn) = q.shape, block
    per = scale_inv.repeat_interleave(bm, 0)[:r].repeat_interleave(bn, 1)[:, :c]
    return q.float() * per


def test_every_e4m3fn_code_decodes_as_torch():
    codes = torch.arange(256, dtype=torch.uint8)
    expected = codes.view(torch.float8_e4m3fn).float().numpy()
    nan = np.isnan(expected)
    assert np.flatnonzero(nan).tolist() == [0x7F, 0xFF]  # E4M3FN: no infinities
    assert np.array_equal(np.isnan(E4M3FN), nan)
    assert np.array_equal(E4M3FN[~nan].view(np.uint32), expected[~nan].view(np.uint32))
    assert E4M3FN[0x7E] == 448.0 and E4M3FN[0x01] == 2.0**-9  # largest, least subnormal


@pytest.mark.parametrize(("shape", "block"), [((200, 300), (128, 128)), ((256, 256), (128, 128))])
def test_ragged_and_square_blocks_dequantize_as_torch(tmp_path, shape, block):
    """200 x 300 in 128 blocks: a 2 x 3 grid whose last row and column of blocks are
    ragged; 256 x 256: a square grid, where a transposed grid still fits. Written by
    safetensors' own torch writer, read back by msgen's reader."""
    torch.manual_seed(1)
    w = torch.randn(shape) * torch.logspace(-3, 1, shape[1])  # blocks of unlike scales
    q, scale_inv = quantize(w, block)
    safetensors_torch.save_file({"w": q, "w_scale_inv": scale_inv}, str(tmp_path / "q.st"))
    codes, dtype = read_tensor(tmp_path / "q.st", "w")
    assert dtype == "F8_E4M3" and codes.shape == shape
    scales, _ = read_tensor(tmp_path / "q.st", "w_scale_inv")
    got = dequantize(codes, scales, block)
    expected = torch_dequant(q, scale_inv, block).numpy()
    assert got.dtype == np.float32
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))
    assert np.abs(got - w.numpy()).max() <= np.abs(w.numpy()).max() / 16  # it is w
    # and as bf16 (what to-hf writes for a bf16 config) it is DeepSeek's fp8_cast_bf16.py
    bf16 = torch_dequant(q, scale_inv, block).to(torch.bfloat16).view(torch.int16).numpy()
    assert np.array_equal(from_float32(got, "BF16"), bf16.view(np.uint16))


PROJECTION = re.compile(r"_proj(_with_mqa)?\.weight$")


def quantized_names(names) -> list[str]:
    """The weights DeepSeek-V3's checkpoint stores FP8: every projection of the
    layers (attention, MLP, experts, shared experts); not the router, the norms, the
    embeddings or the output layer."""
    return [n for n in names if n.startswith("model.layers.") and PROJECTION.search(n)]


def write_fp8(source: Path, dest: Path, edit=None) -> None:
    """`dest`: the fp32 checkpoint in `source` with its projections stored as
    float8_e4m3fn codes and `<name>_scale_inv`, config.json with quantization_config
    (`edit(tensors, config)` changes them first); written by msgen's writer."""
    dest.mkdir()
    file = source / "model.safetensors"
    tensors = {n: read_tensor(file, n) for n in read_header(file)[0]}
    for name in quantized_names(tensors):
        q, scale_inv = quantize(torch.from_numpy(tensors[name][0].copy()), BLOCK)
        tensors[name] = (q.view(torch.uint8).numpy(), "F8_E4M3")
        tensors[name + "_scale_inv"] = (scale_inv.numpy(), "F32")
    config = json.loads((source / "config.json").read_text())
    config["quantization_config"] = dict(QUANTIZATION)
    if edit is not None:
        edit(tensors, config)
    with open(dest / "model.safetensors", "wb") as f:
        f.writelines(encode(tensors, {"format": "pt"}))
    (dest / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(transformers' model holding the dequantized weights, its fp32 folder, the
    FP8 folder of the same weights, the spec on one device, on 4 devices)."""
    root = tmp_path_factory.mktemp("fp8")
    model = hf_model("deepseek_v3", root / "random")
    write_fp8(root / "random", root / "fp8")
    with torch.no_grad():  # the model's weights become the dequantized ones
        file = root / "fp8" / "model.safetensors"
        for name, p in model.named_parameters():
            if name + "_scale_inv" in read_header(file)[0]:
                q = torch.from_numpy(read_tensor(file, name)[0].copy()).view(torch.float8_e4m3fn)
                scale_inv = torch.from_numpy(read_tensor(file, name + "_scale_inv")[0].copy())
                p.copy_(torch_dequant(q, scale_inv, BLOCK))
    model.save_pretrained(root / "dequantized", safe_serialization=True)
    spec, spec4 = root / "m.msl", root / "m4.msl"
    config = root / "fp8" / "config.json"
    assert msgen("import", "hf", config, "-o", spec, "--seq", SEQ)[0] == 0
    # one server of 4 devices, the mesh then set per command (the planner is not needed)
    spec4.write_text(re.sub(r"per_node = 1\n", "per_node = 4\n", spec.read_text()))
    return model, root / "dequantized", root / "fp8", spec, spec4


def checkpoint(path: Path) -> dict[str, np.ndarray]:
    return {n: p.asnumpy() for n, p in ms.load_checkpoint(str(path)).items()}


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)


def test_fp8_weights_give_the_dequantized_checkpoint_and_transformers_logits(folders, tmp_path):
    """The checkpoint is the dequantized fp32 folder's, bit for bit; the logits are
    transformers' on the dequantized weights (measured 4.8e-7; on the weights before
    quantization they differ by 0.34, so 1e-4 tells the two apart)."""
    model, dequantized, fp8, spec, _ = folders
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    code, err = msgen("ckpt", "from-hf", spec, fp8, "-o", tmp_path / "a")
    assert code == 0, err
    assert msgen("ckpt", "from-hf", spec, dequantized, "-o", tmp_path / "b")[0] == 0
    got = checkpoint(tmp_path / "a" / "model.ckpt")
    assert same(got, checkpoint(tmp_path / "b" / "model.ckpt"))  # torch's dequantization
    net = compiled_network(spec, tmp_path / "gen")
    missing, _ = ms.load_param_into_net(net, ms.load_checkpoint(str(tmp_path / "a/model.ckpt")))
    assert [n for n in missing if n != "add_aux.total" and not n.endswith(".expert_load")] == []
    assert logits_error(model, net) < 1e-4
    # to-hf: the dequantized floats in the config's dtype, no scales, no quantization
    code, err = msgen("ckpt", "to-hf", spec, tmp_path / "a", "-o", tmp_path / "back")
    assert code == 0, err
    back, source = tmp_path / "back" / "model.safetensors", dequantized / "model.safetensors"
    assert set(read_header(back)[0]) == set(read_header(source)[0])
    for name in read_header(source)[0]:
        assert np.array_equal(read_tensor(source, name)[0], read_tensor(back, name)[0]), name
    assert "quantization_config" not in json.loads((tmp_path / "back/config.json").read_text())


def test_per_rank_slices_are_the_dequantized_weights_slices(folders, tmp_path):
    """dp 2 x tp 2 x ep 2: each rank's file from the FP8 folder is the one from the
    dequantized folder (the weight dequantized whole, then cut)."""
    _, dequantized, fp8, _, spec = folders
    sets = [a for s in SLICED for a in ("--set", s)]
    assert msgen("ckpt", "from-hf", spec, fp8, "-o", tmp_path / "a", *sets)[0] == 0
    assert msgen("ckpt", "from-hf", spec, dequantized, "-o", tmp_path / "b", *sets)[0] == 0
    for rank in range(4):
        got = checkpoint(tmp_path / "a" / f"rank_{rank}" / "model.ckpt")
        assert got["decoder_moe.0.att.kv_b"].shape == (16, 64)  # 2 of the 4 heads
        assert same(got, checkpoint(tmp_path / "b" / f"rank_{rank}" / "model.ckpt")), rank


def test_a_sharded_fp8_folder_with_scales_apart_from_their_weights(folders, tmp_path):
    """The index's two shards: every weight in one, every scale in the other (as an
    index may place them); the same checkpoint as the single file."""
    _, _, fp8, spec, _ = folders
    source, folder = fp8 / "model.safetensors", tmp_path / "hf"
    folder.mkdir()
    shutil.copyfile(fp8 / "config.json", folder / "config.json")
    names = sorted(read_header(source)[0])
    shards = {"a.safetensors": [n for n in names if not n.endswith("_scale_inv")]}
    shards["b.safetensors"] = [n for n in names if n.endswith("_scale_inv")]
    for file, part in shards.items():
        with open(folder / file, "wb") as f:
            f.writelines(encode({n: read_tensor(source, n) for n in part}, {}))
    index = {"weight_map": {n: file for file, part in shards.items() for n in part}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert msgen("ckpt", "from-hf", spec, folder, "-o", tmp_path / "a")[0] == 0
    assert msgen("ckpt", "from-hf", spec, fp8, "-o", tmp_path / "b")[0] == 0
    assert same(checkpoint(tmp_path / "a/model.ckpt"), checkpoint(tmp_path / "b/model.ckpt"))


def _drop_scale(tensors, config):
    del tensors["model.layers.1.mlp.experts.3.up_proj.weight_scale_inv"]


def _transposed_grid(tensors, config):
    name = "model.layers.0.self_attn.o_proj.weight_scale_inv"  # [3, 2] for [64, 64]
    tensors[name] = (np.ascontiguousarray(tensors[name][0].T), "F32")


def _no_quantization(tensors, config):
    del config["quantization_config"]


def _e5m2(tensors, config):
    config["quantization_config"]["fmt"] = "e5m2"


def _gptq(tensors, config):
    config["quantization_config"]["quant_method"] = "gptq"


def _scale_beside_a_float_weight(tensors, config):
    name = "model.layers.0.self_attn.q_a_proj.weight"
    tensors[name] = (np.zeros((24, 64), np.float32), "F32")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            _drop_scale,
            "model.layers.1.mlp.experts.3.up_proj.weight is F8_E4M3 without its scale "
            "model.layers.1.mlp.experts.3.up_proj.weight_scale_inv",
        ),
        (
            _transposed_grid,
            "model.layers.0.self_attn.o_proj.weight_scale_inv is [2, 3]: "
            "model.layers.0.self_attn.o_proj.weight [64, 64] in blocks of [24, 40] has [3, 2]",
        ),
        (_no_quantization, "is F8_E4M3, and "),
        (_e5m2, "quantization_config.fmt 'e5m2' is not supported"),
        (_gptq, "quantization_config.quant_method 'gptq'"),
        (_scale_beside_a_float_weight, "q_a_proj.weight is F32 and has a _scale_inv"),
    ],
)
def test_a_checkpoint_unlike_its_config_is_one_line(folders, tmp_path, edit, message):
    _, dequantized, _, spec, _ = folders
    write_fp8(dequantized, tmp_path / "hf", edit)
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "out")
    assert code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert "model.safetensors" in err or "config.json" in err  # located
    assert not (tmp_path / "out").exists()


def test_an_e5m2_tensor_is_refused_by_its_dtype(folders, tmp_path):
    _, _, fp8, spec, _ = folders
    shutil.copytree(fp8, tmp_path / "hf")
    file = tmp_path / "hf" / "model.safetensors"
    data = file.read_bytes().replace(b'"F8_E4M3"', b'"F8_E5M2"', 1)  # same length
    file.write_bytes(data)
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "out")
    assert code == 2 and "dtype F8_E5M2, which msgen does not read" in err, err


def test_the_published_config_with_its_quantization_imports_with_transformers_count(tmp_path):
    """deepseek-ai/DeepSeek-V3's config.json carries quantization_config (the
    weights' storage, not the model): the count is the unquantized model's."""
    config = json.loads((CONFIGS / "deepseek_v3.json").read_text())
    config["quantization_config"] = {**QUANTIZATION, "weight_block_size": [128, 128]}
    proc, spec = imported(tmp_path, config)
    assert proc.returncode == 0, proc.stderr
    doc = estimate(spec)  # the main model's count; the MTP layer is counted apart
    assert doc["params_total"] - doc["params_mtp"] == 671_026_404_352
