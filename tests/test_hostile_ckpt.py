"""Hostile input and damaged state for `msgen ckpt` (merge, reshard, from-hf, to-hf) and
train.py's run folder: lying headers and indexes, odd rank folders, outputs that are
not what they seem. Each ends in exit 2 and one line naming the file (and the key), or
in a complete, right result; nothing of the user's is lost, nothing is written through
a link. Two writers at once and a writer killed by SIGKILL: test_hostile_ckpt_writers.py.

The runs are tests/test_ckpt_reshard.py's (a tiny run's slices over dp 2 x tp 2 x pp 2,
cut by numpy from a full state, the oracle), the Hugging Face folder test_ckpt_hf.py's
small LLaMA saved by transformers.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from tests.emit_fixtures import SPECS, compile_spec, compiled, load
from tests.oracles import require
from tests.test_ckpt_hf import SEQ, hf_model
from tests.test_ckpt_reshard import full_state, loaded, msgen, write_run

ms = require("mindspore")
torch = require("torch")
ROOT = Path(__file__).resolve().parents[1]
SPEC = SPECS["tiny"]  # dp 2, tp 2, pp 2, zero 1
TP4 = ("--set", "mesh.tp=4", "--set", "mesh.dp=1")
DP8 = ("--set", "mesh.tp=1", "--set", "mesh.pp=1", "--set", "train.zero=0")


def one_line(code: int, err: str, *parts: str) -> None:
    """Exit 2 and one line holding every part (beside --set's notes and MindSpore's
    warnings): never a traceback."""
    lines = [
        line
        for line in err.splitlines()
        if line.strip() and "[WARNING]" not in line and not line.startswith("note: ")
    ]
    assert code == 2 and len(lines) == 1, (code, err)
    assert "Traceback" not in err and "internal error" not in err, err
    for part in parts:
        assert part in lines[0], (part, lines[0])


def listing(folder: Path) -> dict[str, bytes | None]:
    return {
        p.relative_to(folder).as_posix(): None if p.is_dir() else p.read_bytes()
        for p in sorted(folder.rglob("*"))
    }


def build_runs(base: Path):
    """(tree, run at step 5 on the spec's mesh, its full state, run at step 4)."""
    tree = compile_spec(SPEC, base / "tree")
    full = full_state(tree, 5)
    write_run(tree, base / "run", full, 5)
    write_run(tree, base / "run4", {n: v + 1 for n, v in full.items()}, 4)
    return tree, base / "run", full, base / "run4"


def build_hf(base: Path):
    """(Hugging Face folder, the spec import hf wrote for it)."""
    hf_model("llama", base / "hf", torch.float32)
    spec = base / "m.msl"
    code, err = msgen("import", "hf", base / "hf" / "config.json", "-o", spec, "--seq", SEQ)
    assert code == 0, err
    return base / "hf", spec


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return build_runs(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return build_hf(tmp_path_factory.mktemp("hf"))


def copy_of(folder: Path, dest: Path) -> Path:
    shutil.copytree(folder, dest, symlinks=True)
    return dest


# 1. Unbounded work from one number -------------------------------------------------


def test_a_rank_folder_numbered_100000000_is_counted_not_listed(runs, tmp_path):
    """Under a 1 GiB address-space limit: a set of every rank up to 10^8 needs ~5 GB."""
    run = copy_of(runs[1], tmp_path / "run")
    (run / "rank_100000000").mkdir()

    def limited():
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "msgen.cli", "ckpt", "merge", str(SPEC), str(run),
         "-o", str(tmp_path / "m.ckpt")],
        capture_output=True, text=True, timeout=120, env=env, preexec_fn=limited,
    )  # fmt: skip
    one_line(done.returncode, done.stderr, "9 rank folders, up to rank_100000000: no rank_8")


def test_a_rank_folder_train_py_never_names_is_refused_not_taken_for_another(runs, tmp_path):
    run = copy_of(runs[1], tmp_path / "run")
    (run / "rank_1").rename(run / "rank_01")
    code, err = msgen("ckpt", "merge", SPEC, run, "-o", tmp_path / "m.ckpt")
    one_line(code, err, "rank_01 is not a rank folder train.py writes")


def test_the_shapes_read_from_headers_are_mindspores(runs, tmp_path):
    """msgen.ckpt.ckptfile reads names and shapes without the data: the same as
    MindSpore's load_checkpoint for a run's slices, a scalar, a CRC-checked file with a
    string beside the tensors; a truncated or foreign file is a CkptFileError."""
    from msgen.ckpt.ckptfile import CkptFileError, tensor_shapes

    path = tmp_path / "extra.ckpt"
    data = [{"name": "w", "data": ms.Tensor(np.ones((3, 0, 2), np.float16))}]
    ms.save_checkpoint(data, str(path), crc_check=True, append_dict={"step": 7, "tag": "x"})
    for file in [path, *sorted(runs[1].glob("rank_*/step_*.ckpt"))[:3]]:
        want = {n: tuple(v.shape) for n, v in ms.load_checkpoint(str(file)).items()
                if not isinstance(v, str)}  # fmt: skip
        assert tensor_shapes(file) == want, file
    whole = (runs[1] / "rank_0" / "step_00000005.ckpt").read_bytes()
    for damaged in (whole[: len(whole) // 2], b"\x0a\xff", b"not a checkpoint\n", b""):
        path.write_bytes(damaged)
        with pytest.raises(CkptFileError):
            tensor_shapes(path)


# 5. A FIFO, and an index pointing out of its folder ---------------------------------


def test_a_fifo_in_place_of_a_step_file_is_said_to_be_one(runs, tmp_path):
    run = copy_of(runs[1], tmp_path / "run")
    step = run / "rank_1" / "step_00000005.ckpt"
    step.unlink()
    os.mkfifo(step)
    code, err = msgen("ckpt", "merge", SPEC, run, "-o", tmp_path / "m.ckpt")
    one_line(code, err, f"{step} is a FIFO, not a checkpoint file")


def test_an_index_naming_a_file_outside_its_folder_quotes_none_of_it(hf, tmp_path):
    folder, spec = hf
    source = copy_of(folder, tmp_path / "hf")
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"password=hunter2 and more\n")
    index = {"weight_map": {"model.embed_tokens.weight": "../secret.txt"}}
    (source / "model.safetensors.index.json").write_text(json.dumps(index))
    code, err = msgen("ckpt", "from-hf", spec, source, "-o", tmp_path / "init")
    one_line(code, err, "model.safetensors.index.json", "weight_map.model.embed_tokens.weight")
    assert "hunter2" not in err and "password" not in err
    (leaked,) = struct.unpack("<Q", secret.read_bytes()[:8])
    assert str(leaked) not in err
    assert not (tmp_path / "init").exists()


# 4. Wrongly typed values: safetensors headers, index.json, source.json ---------------


def safetensors_with(path: Path, change) -> None:
    """`path`, a safetensors file, rewritten with its header dict passed through
    `change` (which returns the new header, or its JSON text)."""
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    new = change(header)
    text = (new if isinstance(new, str) else json.dumps(new)).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + size :])


def first(header: dict) -> str:
    return sorted(k for k in header if k != "__metadata__")[0]


# two tensors of one shape: layer 0's two RMSNorm weights
PAIR = ("model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight")


def overlap(h: dict) -> dict:
    a, b = PAIR
    h[b]["data_offsets"] = h[a]["data_offsets"]  # b reads a's bytes
    return h


def duplicate(h: dict) -> str:
    a, b = PAIR
    text = json.dumps(h)
    return text[:-1] + f', "{a}": {json.dumps(h[b])}}}'  # a given twice, b's entry second


def set_entry(key, value):
    def change(h: dict) -> dict:
        h[first(h)][key] = value
        return h

    return change


HEADERS = {
    # class 2: would convert with exit 0 into garbage
    "overlapping tensors": (overlap, ["overlaps the tensor before it"]),
    "a name twice": (duplicate, ["model.layers.0.input_layernorm.weight is there twice"]),
    "a gap in the data": (
        lambda h: {**h, first(h): {**h[first(h)], "data_offsets": [
            h[first(h)]["data_offsets"][0] + 4, h[first(h)]["data_offsets"][1] + 4]}},
        ["data_offsets"],
    ),  # fmt: skip
    # class 4: tracebacks before
    "shape a string": (set_entry("shape", "abc"), ["shape: expected a list, got a string"]),
    "offsets of lists": (set_entry("data_offsets", [[1], {}]), ["data_offsets[0]"]),
    "three offsets": (set_entry("data_offsets", [0, 4, 8]), ["data_offsets"]),
    "an entry a list": (lambda h: {**h, first(h): [1, 2]}, ["expected an object, got a list"]),
    "metadata a list": (lambda h: {**h, "__metadata__": [1]}, ["__metadata__"]),
    "metadata of numbers": (lambda h: {**h, "__metadata__": {"format": 1}}, ["__metadata__"]),
    "dtype a number": (set_entry("dtype", 7), ["dtype: expected a string"]),
    "a negative dim": (set_entry("shape", [-1, 64]), ["shape[0]"]),
    "a shape past any array": (
        set_entry("shape", [2**62, 2**62, 4]),
        ["larger than any array"],
    ),  # int64 wraps this product to 0; Python's does not
    "a 400-digit dim": (lambda h: json.dumps(h).replace('"shape": [', '"shape": [' + "9" * 400 + ", ", 1), ["400 digits"]),  # fmt: skip
    "nested past the parser": (lambda h: "[" * 100_000 + "]" * 100_000, ["nested deeper"]),
    "not an object": (lambda h: "[1, 2]", ["expected an object"]),
}


@pytest.mark.parametrize("case", sorted(HEADERS))
def test_a_lying_safetensors_header_is_one_line_and_nothing_written(hf, tmp_path, case):
    folder, spec = hf
    change, parts = HEADERS[case]
    source = copy_of(folder, tmp_path / "hf")
    safetensors_with(source / "model.safetensors", change)
    code, err = msgen("ckpt", "from-hf", spec, source, "-o", tmp_path / "init")
    one_line(code, err, str(source / "model.safetensors"), *parts)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no output, no scratch


INDEXES = {
    "weight_map a list": ('{"weight_map": [1]}', ["weight_map: expected an object"]),
    "a file a list": ('{"weight_map": {"w": ["x"]}}', ["weight_map.w: expected a string"]),
    "no weight_map": ('{"metadata": {}}', ["weight_map: missing"]),
    "an absolute file": ('{"weight_map": {"w": "/etc/hostname"}}', ["not a file name"]),
    "a nested file": ('{"weight_map": {"w": "sub/x.safetensors"}}', ["not a file name"]),
    "a folder": ('{"weight_map": {"w": "."}}', ["not a file name"]),
    "not JSON": ("{", ["not JSON"]),
    "nested past the parser": ("[" * 100_000 + "]" * 100_000, ["nested deeper"]),
    "a 400-digit size": ('{"metadata": {"total_size": ' + "9" * 400 + '}, "weight_map": {}}',
                         ["400 digits"]),  # fmt: skip
}


@pytest.mark.parametrize("case", sorted(INDEXES))
def test_a_lying_index_is_one_line_naming_the_key(hf, tmp_path, case):
    folder, spec = hf
    text, parts = INDEXES[case]
    source = copy_of(folder, tmp_path / "hf")
    (source / "model.safetensors.index.json").write_text(text)
    code, err = msgen("ckpt", "from-hf", spec, source, "-o", tmp_path / "init")
    one_line(code, err, "model.safetensors.index.json", *parts)
    assert not (tmp_path / "init").exists()


@pytest.fixture(scope="module")
def converted(hf, tmp_path_factory):
    """from-hf's folder of the small LLaMA (model.ckpt and source.json)."""
    folder, spec = hf
    out = tmp_path_factory.mktemp("converted") / "init"
    code, err = msgen("ckpt", "from-hf", spec, folder, "-o", out)
    assert code == 0, err
    return out


SOURCES = {
    "dtypes a list": (lambda d: {**d, "dtypes": [1]}, ["dtypes: expected an object"]),
    "a dtype a number": (
        lambda d: {**d, "dtypes": {**d["dtypes"], "lm_head.weight": 4}},
        ["dtypes.lm_head.weight: expected a string"],
    ),
    "an integer dtype": (
        lambda d: {**d, "dtypes": {**d["dtypes"], "lm_head.weight": "I64"}},
        ["dtypes.lm_head.weight", "I64"],
    ),
    "config a list": (lambda d: {**d, "config": [1]}, ["config: expected an object"]),
    "no config": (lambda d: {"dtypes": d["dtypes"]}, ["config: missing"]),
    "config hidden a string": (
        lambda d: {**d, "config": {**d["config"], "hidden_size": "64"}},
        ["config", "hidden_size"],
    ),
    "nested past the parser": (lambda d: "[" * 100_000 + "]" * 100_000, ["nested deeper"]),
    # found by fuzzing: a config of another model than the spec's (MLP biases)
    "config of another model": (
        lambda d: {**d, "config": {**d["config"], "mlp_bias": True}},
        ["config is not the spec's model", "decoder.0.gate.bias is not a parameter"],
    ),
}


@pytest.mark.parametrize("case", sorted(SOURCES))
def test_a_lying_source_json_is_one_line_naming_the_key(hf, converted, tmp_path, case):
    _, spec = hf
    change, parts = SOURCES[case]
    init = copy_of(converted, tmp_path / "init")
    doc = change(json.loads((init / "source.json").read_text()))
    (init / "source.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    code, err = msgen("ckpt", "to-hf", spec, init, "-o", tmp_path / "back")
    one_line(code, err, "source.json", *parts)
    assert not (tmp_path / "back").exists()


STRATEGIES = {
    "dev_matrix a string": (["dev_matrix"], "x", "dev_matrix: expected a list"),
    "tensor_map past the matrix": (["tensor_map"], [5, -1], "names a device dim past"),
    "layouts a list": (None, [], "parallel_layout_item: expected an object"),
}


@pytest.mark.parametrize("case", sorted(STRATEGIES))
def test_a_lying_strategy_file_is_one_line_naming_the_key(runs, tmp_path, case):
    keys, value, part = STRATEGIES[case]
    run = copy_of(runs[1], tmp_path / "run")
    path = run / "rank_0" / "strategy.json"
    doc = json.loads(path.read_text())
    if keys is None:
        doc["parallel_layout_item"] = value
    else:
        doc["parallel_layout_item"]["decoder.0.up.weight"][keys[0]] = value
    path.write_text(json.dumps(doc))
    code, err = msgen("ckpt", "merge", SPEC, run, "-o", tmp_path / "m.ckpt")
    one_line(code, err, str(path), part)


# 2. Silent wrong checkpoints ------------------------------------------------------


def test_reshard_force_replaces_the_old_output_whole(runs, tmp_path):
    """A tp 4 output of step 5, resharded over with --force from the step-4 run to a
    data-parallel mesh: only the new files remain (no tp 4 strategy file, no step 5),
    and merging it gives the step-4 state."""
    _, run, full, run4 = runs
    out = tmp_path / "out"
    assert msgen("ckpt", "reshard", SPEC, run, "-o", out, *TP4)[0] == 0
    (out / "notes.txt").write_text("mine\n")  # the user's: carried over
    code, err = msgen("ckpt", "reshard", SPEC, run4, "-o", out, "--force", *DP8)
    assert code == 0, err
    expected = {"notes.txt"} | {f"rank_{r}" for r in range(8)}
    expected |= {f"rank_{r}/step_00000004.ckpt" for r in range(8)}
    assert set(listing(out)) == expected
    assert (out / "notes.txt").read_text() == "mine\n"
    state = loaded(out / "rank_5" / "step_00000004.ckpt")
    for name, value in full.items():
        if name not in ("step", "global_step"):
            np.testing.assert_array_equal(state[name], value + 1, err_msg=name)


def test_merge_refuses_a_newer_step_saved_under_another_mesh(runs, tmp_path):
    """Each rank folder of the tp 2 run also holds a step 9 whose slices are tp 4's:
    merge names it instead of merging it under the tp 2 strategy files."""
    _, run, _, _ = runs
    assert msgen("ckpt", "reshard", SPEC, run, "-o", tmp_path / "tp4", *TP4)[0] == 0
    mixed = copy_of(run, tmp_path / "mixed")
    for rank in range(8):
        shutil.copy(tmp_path / "tp4" / f"rank_{rank}" / "step_00000005.ckpt",
                    mixed / f"rank_{rank}" / "step_00000009.ckpt")  # fmt: skip
    code, err = msgen("ckpt", "merge", SPEC, mixed, "-o", tmp_path / "m.ckpt")
    one_line(code, err, "rank_0/step_00000009.ckpt is not the slices rank_0/strategy.json",
             "another mesh")  # fmt: skip
    assert not (tmp_path / "m.ckpt").exists()


def test_resume_refuses_a_checkpoint_of_another_mesh(tmp_path, capsys):
    """train.py --resume's restore: a tensor of another shape than the parameter this
    rank holds is one line naming it, not loaded into the parameter."""
    train = load(compiled("tiny_dp"), "train")
    state = {"w": ms.Parameter(ms.Tensor(np.ones((4, 2), np.float32)), name="w")}
    other = [{"name": "w", "data": ms.Tensor(np.ones((2, 2), np.float32))}]
    ms.save_checkpoint(other, str(tmp_path / "step_00000003.ckpt"), append_dict={"step": 3})
    with pytest.raises(SystemExit) as stop:
        train.restore(tmp_path, state)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "w is [2, 2] in" in err and "[4, 2] here" in err and "another mesh" in err, err
    assert tuple(state["w"].shape) == (4, 2)


def test_to_hf_force_removes_the_old_export_whatever_its_sharding(hf, converted, tmp_path):
    """A sharded export replaced by a single file, and back: no old shard, index or
    model.safetensors stays beside the new one; a file of the user's stays."""
    from msgen.commands.handlers import _analyze
    from msgen.hf.ckpt import CkptOptions, to_hf_command

    _, spec = hf
    back = tmp_path / "back"
    result = _analyze(str(spec), "text")
    assert to_hf_command(result, CkptOptions(spec, converted, back, shard_bytes=40_000)) == 0
    shards = sorted(p.name for p in back.glob("model-*.safetensors"))
    assert len(shards) > 1 and (back / "model.safetensors.index.json").is_file()
    (back / "tokenizer.json").write_text("{}")
    code, err = msgen("ckpt", "to-hf", spec, converted, "-o", back, "--force")
    assert code == 0, err
    assert sorted(p.name for p in back.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json"]  # fmt: skip
    assert to_hf_command(result, CkptOptions(spec, converted, back, True, 40_000)) == 0
    assert sorted(p.name for p in back.iterdir()) == sorted(
        [*shards, "config.json", "model.safetensors.index.json", "tokenizer.json"]
    )


# 3. A run destroyed or a user's files deleted -------------------------------------


def test_merge_into_a_file_inside_the_run_is_refused(runs, tmp_path):
    run = copy_of(runs[1], tmp_path / "run")
    before = listing(run)
    target = run / "rank_1" / "step_00000005.ckpt"
    code, err = msgen("ckpt", "merge", SPEC, run, "-o", target, "--force")
    one_line(code, err, f"-o {target} is inside the run {run}")
    assert listing(run) == before


def test_reshard_refuses_an_output_holding_its_run(runs, tmp_path):
    copy_of(runs[1], tmp_path / "out" / "run")
    code, err = msgen("ckpt", "reshard", SPEC, tmp_path / "out" / "run", "-o", tmp_path / "out",
                      "--force", *TP4)  # fmt: skip
    one_line(code, err, "holds the run")
    assert (tmp_path / "out" / "run" / "rank_7" / "step_00000005.ckpt").is_file()


def test_overwrite_removes_only_the_files_train_py_writes(tmp_path, capsys):
    train = load(compiled("tiny_dp"), "train")
    folder = tmp_path / "output" / "rank_0"
    folder.mkdir(parents=True)
    theirs = ["log.csv", "step_00000002.ckpt", "step_00000004.ckpt"]
    mine = ["step_best.ckpt", "step_².ckpt", "step_.ckpt", "notes.txt"]
    for name in theirs + mine:
        (folder / name).write_text(name)
    args = Namespace(output=tmp_path / "output", resume=False, overwrite=True)
    assert train.prepare_output(args, 0) == folder
    assert sorted(p.name for p in folder.iterdir()) == sorted(mine)
    assert (
        f"removing 3 files of the run in {folder}: {', '.join(theirs)}" in capsys.readouterr().out
    )
    # and the user's files alone are no run: nothing to refuse without --overwrite
    args = Namespace(output=tmp_path / "output", resume=False, overwrite=False)
    assert train.prepare_output(args, 0) == folder


@pytest.mark.parametrize("command", ["reshard", "from-hf"])
def test_force_never_writes_through_a_linked_rank_folder(runs, hf, tmp_path, command):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "step_00000005.ckpt").write_text("the user's\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "rank_0").symlink_to(victim)
    if command == "reshard":
        code, err = msgen("ckpt", "reshard", SPEC, runs[1], "-o", out, "--force", *TP4)
    else:
        folder, spec = hf
        code, err = msgen("ckpt", "from-hf", spec, folder, "-o", out, "--force",
                          "--set", "mesh.dp=1", "--set", "mesh.tp=2",
                          "--set", "cluster.per_node=2")  # fmt: skip
    assert code == 0, err
    assert listing(victim) == {"step_00000005.ckpt": b"the user's\n"}
    assert not (out / "rank_0").is_symlink() and (out / "rank_0" / "strategy.json").is_file()


def test_force_refuses_a_rank_folder_holding_a_file_of_the_users(runs, tmp_path):
    out = tmp_path / "out"
    assert msgen("ckpt", "reshard", SPEC, runs[1], "-o", out, *TP4)[0] == 0
    (out / "rank_3" / "step_best.ckpt").write_text("the user's\n")
    before = listing(out)
    code, err = msgen("ckpt", "reshard", SPEC, runs[1], "-o", out, "--force", *DP8)
    one_line(code, err, f"{out / 'rank_3' / 'step_best.ckpt'} is not a file train.py or msgen")
    assert listing(out) == before


def test_what_a_killed_switch_left_is_put_back(runs, tmp_path):
    """Killed between setting the old output aside and renaming the new one in: the
    next writer puts the old output back (so it needs --force to replace it again),
    and removes the killed one's scratch, and only that."""
    out = tmp_path / "out"
    assert msgen("ckpt", "reshard", SPEC, runs[1], "-o", out, *TP4)[0] == 0
    before = listing(out)
    out.rename(tmp_path / ".out.msgen-old")
    (tmp_path / ".out.msgen-new-abcd_123" / "output" / "rank_0").mkdir(parents=True)
    (tmp_path / ".out.msgen-new-notes").write_text("not msgen's scratch\n")
    (tmp_path / ".out.msgen-lock").write_text("")  # a killed writer's: no lock held
    code, err = msgen("ckpt", "reshard", SPEC, runs[1], "-o", out, *DP8)
    one_line(code, err, "not empty; add --force")
    assert listing(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.msgen-new-notes", "out"]
