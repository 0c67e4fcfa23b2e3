"""`msgen ckpt from-hf` and `msgen ckpt to-hf`: Hugging Face safetensors to the
MindSpore checkpoint `train.py --init-from` loads, and a checkpoint back to safetensors
with the source model's names, dtypes and config.json.

Tensors move one at a time (msgen.hf.tensors maps the files), are checked against the
spec's parameters by name and shape before anything is written, and are written
atomically. MindSpore is imported only here, to write and read its checkpoint format.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from msgen.base.files import new_file_mode
from msgen.base.status import EXIT_OK, UsageError
from msgen.ckpt.command import scratch, whole_checkpoint
from msgen.ckpt.expected import MOMENTS, check_tensors, spec_params, stage_layouts
from msgen.ckpt.runs import INIT_FILE, SOURCE_FILE, STRATEGY_FILE
from msgen.ckpt.slices import slice_of
from msgen.ckpt.transform import load
from msgen.hf.config import HfConfigError, HfModel, model_of, read_config
from msgen.hf.layout import hf_names, msgen_prefix, to_hf, to_msgen
from msgen.hf.tensors import (
    TensorFileError,
    as_float32,
    encode,
    from_float32,
    read_header,
    read_tensor,
)

SHARD_BYTES = 5 << 30  # to-hf splits larger models into files of about this size
DTYPE_OF = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


@dataclass(frozen=True)
class CkptOptions:
    spec: Path
    source: Path  # from-hf: the Hugging Face folder; to-hf: a from-hf folder or a run
    output: Path
    force: bool = False
    shard_bytes: int = SHARD_BYTES
    origin: Path | None = None  # to-hf of a run: the from-hf folder it started from


def _hf_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (one file, or a sharded set with
    its index)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"{index} is not a safetensors index: {exc}") from exc
        files = {name: folder / file for name, file in weight_map.items()}
        missing = sorted({str(p) for p in files.values() if not p.is_file()})
        if missing:
            raise UsageError(f"missing shard {missing[0]} named in {index.name}")
        return files
    single = folder / "model.safetensors"
    if not single.is_file():
        raise UsageError(f"{folder} has no model.safetensors nor model.safetensors.index.json")
    return {name: single for name in _header(single)[0]}


def _header(path: Path):
    try:
        return read_header(path)
    except (OSError, TensorFileError) as exc:
        raise UsageError(str(exc)) from exc


def _model(config: Path) -> HfModel:
    try:
        return model_of(read_config(config))
    except HfConfigError as exc:
        raise UsageError(str(exc)) from exc


def _fresh_folder(folder: Path, force: bool) -> None:
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"-o {folder} is not a folder")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise UsageError(f"-o {folder} is not empty; add --force to write into it")
    folder.mkdir(parents=True, exist_ok=True)


def _write_bytes(path: Path, chunks) -> None:
    """Stage beside `path`, then rename over it: no reader sees half a file."""
    tmp = path.with_name(f".{path.name}.msgen-new")
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
        os.chmod(tmp, new_file_mode())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def from_hf(result, options: CkptOptions) -> int:
    import mindspore as ms

    model = _model(options.source / "config.json")
    files = _hf_files(options.source)
    headers = {path: _header(path) for path in set(files.values())}
    absent = [n for n in hf_names(model) if n not in headers.get(files.get(n), ({},))[0]]
    if absent:
        raise UsageError(f"{absent[0]} is not in {options.source} (another model?)")
    entries = {name: headers[files[name]][0][name] for name in hf_names(model)}
    dtypes = {name: e.dtype for name, e in entries.items()}
    shapes = {name: e.shape for name, e in entries.items()}

    def zeros(name: str) -> np.ndarray:  # shapes only: checked before any data is read
        return np.broadcast_to(np.float32(0), shapes[name])

    expected = spec_params(result)
    check_tensors({n: a.shape for n, a in to_msgen(model, zeros)}, expected)

    def load(name: str) -> np.ndarray:
        array, dtype = read_tensor(files[name], name, headers[files[name]])
        return as_float32(array, dtype)

    dtype = {"fp32": ms.float32, "bf16": ms.bfloat16, "fp16": ms.float16}
    param = dtype[result.spec.model.param_dtype.value]
    stages = stage_layouts(result, options.spec)
    _fresh_folder(options.output, options.force)
    if stages:
        count = _write_ranks(model, load, zeros, stages, param, options.output)
        wrote = f"{options.output}/rank_*/{INIT_FILE}: {count} ranks' slices"
    else:
        tensors = (
            (n, ms.Tensor(np.ascontiguousarray(a), dtype=param)) for n, a in to_msgen(model, load)
        )
        params = [{"name": n, "data": t} for n, t in tensors]
        _save(params, options.output / INIT_FILE)
        wrote = f"{options.output / INIT_FILE}: {len(params)} parameters"
    config = json.loads((options.source / "config.json").read_text(encoding="utf-8"))
    source = {"config": config, "dtypes": dtypes}
    _write_bytes(options.output / SOURCE_FILE, [json.dumps(source, indent=1).encode()])
    print(f"wrote {wrote}", file=sys.stderr)
    return EXIT_OK


def _save(params: list[dict], path: Path) -> None:
    import mindspore as ms

    tmp = path.with_name(f".{path.stem}.msgen-new.ckpt")  # save_checkpoint appends .ckpt otherwise
    try:
        ms.save_checkpoint(params, str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _ckpt_bytes(name: str, array: np.ndarray, dtype, scratch: Path) -> bytes:
    """One tensor as MindSpore's save_checkpoint writes it: a .ckpt is a run of
    serialized one-value `Checkpoint` messages (train/serialization.py, _exec_save and
    _write_parameter_data), so files of one tensor each, joined, are one checkpoint.
    (from_numpy shares the array's memory; a cast makes the one copy of another dtype.)"""
    import mindspore as ms

    tensor = ms.Tensor.from_numpy(np.ascontiguousarray(array))
    data = tensor if tensor.dtype == dtype else tensor.astype(dtype)
    try:
        ms.save_checkpoint([{"name": name, "data": data}], str(scratch))
        return scratch.read_bytes()
    finally:
        scratch.unlink(missing_ok=True)


def _append(data: bytes, paths: list[Path]) -> None:
    """`data` at the end of each file, one file open at a time (a stage may have more
    ranks than a process may open files)."""
    for path in paths:
        with open(path, "ab") as out:
            out.write(data)


def _write_ranks(model: HfModel, load, zeros, stages, param, output: Path) -> int:
    """Each rank's slices into rank_<r>/model.ckpt, with its stage's strategy file
    beside them (so the folder merges as a run does). Stage by stage, each tensor the
    stage holds is read once and its slice for every rank of the stage appended to that
    rank's staged file: host memory is one tensor and its slices."""

    prefixes = {n: msgen_prefix(model, n) for n in hf_names(model)}
    rank = 0
    for stage in stages:
        needed = {n for n in stage.layouts if not n.startswith(MOMENTS + ("accu_grads.",))}
        read = {h for h, pre in prefixes.items() if any(n.startswith(pre) for n in needed)}

        def get(name: str, read=read) -> np.ndarray:  # another stage's: its shape, unread
            return load(name) if name in read else zeros(name)

        folders = [output / f"rank_{rank + local}" for local in range(stage.devices)]
        for folder in folders:
            folder.mkdir(exist_ok=True)
            _write_bytes(folder / STRATEGY_FILE, [stage.text.encode()])
        staged = [folder / f".{INIT_FILE}.msgen-new" for folder in folders]
        scratch = output / ".slice.msgen-new.ckpt"  # save_checkpoint appends .ckpt otherwise
        try:
            for path in staged:
                path.write_bytes(b"")
            for name, array in to_msgen(model, get):
                if name not in needed:
                    continue
                # the ranks holding each slice (replicas hold the same view), one
                # encoding of it in memory at a time
                holders: dict[tuple, tuple[np.ndarray, list[Path]]] = {}
                for local, path in enumerate(staged):
                    cut = slice_of(array, stage.layouts[name], local)
                    key = (cut.__array_interface__["data"][0], cut.shape, cut.strides)
                    holders.setdefault(key, (cut, []))[1].append(path)
                for cut, paths in holders.values():
                    _append(_ckpt_bytes(name, cut, param, scratch), paths)
            for path, folder in zip(staged, folders):
                os.chmod(path, stat.S_IRUSR)  # as save_checkpoint leaves its files
                os.replace(path, folder / INIT_FILE)
        finally:
            for path in staged:
                path.unlink(missing_ok=True)
        rank += stage.devices
    return rank


def to_hf_command(result, options: CkptOptions) -> int:

    source_file = (options.origin or options.source) / SOURCE_FILE
    if not source_file.is_file():
        raise UsageError(f"{source_file} not found: name the folder from-hf wrote with --from-hf")
    source = json.loads(source_file.read_text(encoding="utf-8"))
    model = model_of(source["config"])
    with scratch(options.output.parent) as work:  # a run's slices merged first
        step, checkpoint = whole_checkpoint(result, options.spec, options.source, work)
        saved = load(checkpoint)
    expected = spec_params(result)
    check_tensors({n: tuple(saved[n].shape) for n in expected if n in saved}, expected)

    def get(name: str) -> np.ndarray:
        return saved[name].float().asnumpy()

    tensors = {}
    for name, array in to_hf(model, get):
        kind = source["dtypes"].get(name, "F32")
        tensors[name] = (from_float32(array, kind), kind)
    _fresh_folder(options.output, options.force)
    shards = _shards(tensors, options.shard_bytes)
    for file, names in shards.items():
        _write_bytes(
            options.output / file, encode({n: tensors[n] for n in names}, {"format": "pt"})
        )
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(t[0].nbytes for t in tensors.values())},
            "weight_map": {n: f for f, names in shards.items() for n in sorted(names)},
        }
        _write_bytes(
            options.output / "model.safetensors.index.json", [json.dumps(index, indent=2).encode()]
        )
    _write_bytes(options.output / "config.json", [json.dumps(source["config"], indent=2).encode()])
    at = f"step {step} of " if step else ""
    print(
        f"wrote {options.output}: {len(tensors)} tensors from {at}{options.source}", file=sys.stderr
    )
    return EXIT_OK


def _shards(tensors: dict, limit: int) -> dict[str, list[str]]:
    """File name -> tensor names, in name order, each file at most about `limit`."""
    groups: list[list[str]] = [[]]
    size = 0
    for name in sorted(tensors):
        nbytes = tensors[name][0].nbytes
        if groups[-1] and size + nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    if len(groups) == 1:
        return {"model.safetensors": groups[0]}
    n = len(groups)
    return {f"model-{i + 1:05d}-of-{n:05d}.safetensors": g for i, g in enumerate(groups)}
