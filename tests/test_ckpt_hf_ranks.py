"""Hugging Face weights for a mesh that slices them: `ckpt from-hf` writes each rank's
slices with its stage's strategy file. Held against MindSpore's own cut of each rank
(parallel/_tensor.py) and its transform_checkpoints, which merges them back into
exactly the whole checkpoint; to-hf of the slices gives the source back bit for bit."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from msgen.hf.tensors import read_header, read_tensor
from tests.oracles import require
from tests.test_ckpt_hf import SEQ, compiled_network, hf_model, msgen

torch = require("torch")
transformers = require("transformers")
ms = require("mindspore")


SLICED_MESHES = {
    # tensor and pipeline parallel: q/k/v, MLP and vocab split on tp, the layers on 2 stages
    "tp2_pp2": ("mesh.dp=1", "mesh.tp=2", "mesh.pp=2"),
    # and the parallel optimizer: weights further split along dim 0 over the dp ranks
    "dp2_tp2_zero1": ("mesh.dp=2", "mesh.tp=2", "mesh.pp=1", "train.zero=1"),
}


@pytest.mark.parametrize("mesh", sorted(SLICED_MESHES))
def test_from_hf_per_rank_slices_merge_back_to_the_whole_weights(tmp_path, mesh):
    """from-hf for a mesh that slices writes each rank's slices with its stage's strategy
    file; MindSpore's transform_checkpoints (msgen ckpt merge) puts them back together
    into exactly the whole checkpoint from-hf writes for one device."""
    hf_model("llama", tmp_path / "hf", torch.float32, intermediate_size=256)  # 64 KB: zero's
    spec = tmp_path / "m.msl"
    code, err = msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ,
                      "--devices", 4, "--per-node", 4)  # fmt: skip
    assert code == 0, err
    sets = [a for s in SLICED_MESHES[mesh] for a in ("--set", s)]
    assert msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "whole")[0] == 0
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "ranks", *sets)
    assert code == 0, err
    assert not (tmp_path / "ranks" / "model.ckpt").exists()
    strategy = json.loads((tmp_path / "ranks" / "rank_0" / "strategy.json").read_text())
    sharded = [v["opt_weight_shard_size"] for v in strategy["parallel_layout_item"].values()]
    assert any(sharded) == ("train.zero=1" in SLICED_MESHES[mesh])
    assert sorted(p.name for p in (tmp_path / "ranks").glob("rank_*")) == [
        f"rank_{r}" for r in range(4)
    ]
    code, err = msgen("ckpt", "merge", spec, tmp_path / "ranks", "-o", tmp_path / "m.ckpt", *sets)
    assert code == 0, err
    whole = ms.load_checkpoint(str(tmp_path / "whole" / "model.ckpt"))
    merged = ms.load_checkpoint(str(tmp_path / "m.ckpt"))
    assert set(merged) == set(whole)
    for name, value in whole.items():
        assert np.array_equal(merged[name].asnumpy(), value.asnumpy()), name
    # to-hf merges the slices first: the source tensors come back
    code, err = msgen("ckpt", "to-hf", spec, tmp_path / "ranks", "-o", tmp_path / "back", *sets)
    assert code == 0, err
    source, back = tmp_path / "hf" / "model.safetensors", tmp_path / "back" / "model.safetensors"
    for name in read_header(source)[0]:
        assert np.array_equal(read_tensor(source, name)[0], read_tensor(back, name)[0]), name


def test_a_ranks_slice_is_the_one_mindspore_cuts_for_it(tmp_path):
    """Each rank's tensor-parallel slice equals MindSpore's own cut for that rank
    (parallel/_tensor.py `_load_tensor`, from the strategy file's device matrix and
    tensor map): the first dim of o and down, the second of qkv, gate and up."""
    from mindspore.parallel._tensor import _load_tensor

    hf_model("llama", tmp_path / "hf", torch.float32)
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ,
                 "--devices", 2, "--per-node", 2)[0] == 0  # fmt: skip
    sets = ("--set", "mesh.dp=1", "--set", "mesh.tp=2")
    assert msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "whole")[0] == 0
    assert msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "ranks", *sets)[0] == 0
    whole = ms.load_checkpoint(str(tmp_path / "whole" / "model.ckpt"))
    split_dims = set()
    for rank in range(2):
        folder = tmp_path / "ranks" / f"rank_{rank}"
        layouts = json.loads((folder / "strategy.json").read_text())["parallel_layout_item"]
        for name, value in ms.load_checkpoint(str(folder / "model.ckpt")).items():
            layout = layouts[name]
            cut = _load_tensor(whole[name], layout["dev_matrix"], layout["tensor_map"],
                               rank_id=rank)  # fmt: skip
            assert np.array_equal(value.asnumpy(), cut), (rank, name)
            split_dims |= {d for d, m in enumerate(layout["tensor_map"]) if m >= 0}
    assert split_dims == {0, 1}
    # and reshard (MindSpore's transform_checkpoints) of the whole weights cuts the same
    code, err = msgen("ckpt", "reshard", spec, tmp_path / "whole", "-o", tmp_path / "re", *sets)
    assert code == 0, err
    for rank in range(2):
        ours = ms.load_checkpoint(str(tmp_path / "ranks" / f"rank_{rank}" / "model.ckpt"))
        theirs = ms.load_checkpoint(str(tmp_path / "re" / f"rank_{rank}" / "model.ckpt"))
        assert set(ours) == set(theirs)
        for name, value in theirs.items():
            assert np.array_equal(ours[name].asnumpy(), value.asnumpy()), (rank, name)


def from_hf_counted(tmp_path, monkeypatch, sets) -> tuple[list[str], list[str]]:
    """from-hf of a tiny llama for the mesh `sets`: the names of the tensors it read
    from the safetensors file, and of the slices it encoded, in order."""
    from msgen.hf import ckpt as hf_ckpt
    from msgen.hf import fp8  # where from-hf reads each tensor (and its scale, if FP8)

    hf_model("llama", tmp_path / "hf", torch.float32)
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ,
                 "--devices", 4, "--per-node", 4)[0] == 0  # fmt: skip
    reads, encoded = [], []
    encode = hf_ckpt._ckpt_bytes

    def read(path, name, header=None):
        reads.append(name)
        return read_tensor(path, name, header)

    def counted(name, *args):
        encoded.append(name)
        return encode(name, *args)

    monkeypatch.setattr(fp8, "read_tensor", read)
    monkeypatch.setattr(hf_ckpt, "_ckpt_bytes", counted)
    sets = [a for s in sets for a in ("--set", s)]
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "ranks", *sets)
    assert code == 0, err
    return reads, encoded


def test_from_hf_reads_each_tensor_once_per_stage(tmp_path, monkeypatch):
    """tp 2 x pp 2: the tp ranks of a stage share every read, and no stage reads
    another's layers (untied llama: each source tensor lives on one stage), so every
    tensor of the safetensors file is read exactly once."""
    reads, _ = from_hf_counted(tmp_path, monkeypatch, SLICED_MESHES["tp2_pp2"])
    assert sorted(reads) == sorted(read_header(tmp_path / "hf" / "model.safetensors")[0])


def test_from_hf_encodes_a_slice_its_replicas_share_once(tmp_path, monkeypatch):
    """dp 2 x tp 2, zero 0: both dp replicas hold each tp slice; each distinct slice
    (as the ranks' files hold them) is encoded once, not once per rank."""
    mesh = ("mesh.dp=2", "mesh.tp=2", "mesh.pp=1", "train.zero=0")
    _, encoded = from_hf_counted(tmp_path, monkeypatch, mesh)
    distinct = set()
    for rank in range(4):
        saved = ms.load_checkpoint(str(tmp_path / "ranks" / f"rank_{rank}" / "model.ckpt"))
        distinct |= {(name, p.asnumpy().tobytes()) for name, p in saved.items()}
    assert sorted(encoded) == sorted(name for name, _ in distinct)


@pytest.mark.slow
def test_init_from_per_rank_slices_standalone_asks_for_the_merge(tmp_path):
    """A stand-alone run holds whole weights: given the per-rank slices from-hf wrote
    for a sliced mesh, train.py says to merge them, in one line, before any step."""
    import subprocess

    hf_model("llama", tmp_path / "hf", torch.float32)
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ,
                 "--devices", 2, "--per-node", 2)[0] == 0  # fmt: skip
    sets = ("--set", "mesh.dp=1", "--set", "mesh.tp=2")
    assert msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "ranks", *sets)[0] == 0
    compiled_network(spec, tmp_path / "gen")
    tree = next(p for p in (tmp_path / "gen").iterdir() if p.is_dir())
    run = subprocess.run(
        [sys.executable, "train.py", "--standalone", "--synthetic", "--steps", "1"]
        + ["--init-from", str(tmp_path / "ranks"), "--output", str(tmp_path / "out")],
        cwd=tree, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "holds per-rank slices; msgen ckpt merge makes the whole weights" in run.stderr
    assert not list((tmp_path / "out").glob("rank_0/step_*.ckpt"))


def test_a_tied_bf16_model_through_per_rank_slices_comes_back_bit_for_bit(tmp_path):
    """Qwen2 with tied embeddings in bf16, sliced for tp 2 x pp 2 (the table on the
    first stage for the embedding and on the last for the output layer), then to-hf."""
    hf_model("qwen2", tmp_path / "hf", torch.bfloat16)
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ,
                 "--devices", 4, "--per-node", 4)[0] == 0  # fmt: skip
    sets = [a for s in SLICED_MESHES["tp2_pp2"] for a in ("--set", s)]
    assert msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "ranks", *sets)[0] == 0
    last = ms.load_checkpoint(str(tmp_path / "ranks" / "rank_2" / "model.ckpt"))
    assert "emb.table" in last and "logits.weight" not in last
    code, err = msgen("ckpt", "to-hf", spec, tmp_path / "ranks", "-o", tmp_path / "back", *sets)
    assert code == 0, err
    source, back = tmp_path / "hf" / "model.safetensors", tmp_path / "back" / "model.safetensors"
    assert set(read_header(back)[0]) == set(read_header(source)[0])
    for name in read_header(source)[0]:
        a, b = read_tensor(source, name), read_tensor(back, name)
        assert a[1] == b[1] == "BF16" and np.array_equal(a[0], b[0]), name
