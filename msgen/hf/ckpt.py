"""`msgen ckpt from-hf` and `msgen ckpt to-hf`: Hugging Face safetensors to the
MindSpore checkpoint `train.py --init-from` loads, and a checkpoint back to safetensors
with the source model's names, dtypes and config.json.

Tensors move one at a time (msgen.hf.tensors maps the files), are checked against the
spec's parameters by name and shape before anything is written; every header and
index is validated before a byte is converted (msgen.hf.tensors), and the output is
staged and switched in whole by one writer at a time (msgen.ckpt.output). MindSpore is
imported only here, to write and read its checkpoint format.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from msgen.analysis.mtp import setting
from msgen.base.readers import BadInput, Dict, Obj, Str, load_json
from msgen.base.status import EXIT_OK, UsageError
from msgen.ckpt.command import whole_checkpoint
from msgen.ckpt.expected import (
    MOMENTS,
    check_tensors,
    spec_buffers,
    spec_params,
    stage_layouts,
)
from msgen.ckpt.output import HF_FORMS, RUN_FORMS, Forms, claim
from msgen.ckpt.runs import INIT_FILE, SOURCE_FILE, STRATEGY_FILE, what_it_is
from msgen.ckpt.slices import slice_of
from msgen.ckpt.transform import load
from msgen.diagnostics import printable
from msgen.hf.config import model_of, read_config
from msgen.hf.fp8 import dequantized_config, hf_tensors, quantization_of
from msgen.hf.layout import check_copies, hf_names, hf_shapes, msgen_shapes, to_hf, to_msgen
from msgen.hf.model import HfModel
from msgen.hf.tensors import encode, from_float32, read_header

SHARD_BYTES = 5 << 30  # to-hf splits larger models into files of about this size
DTYPE_OF = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
INDEX_FILE = "model.safetensors.index.json"
JSON_LIMIT = 64 << 20  # an index or source.json: about 100 bytes a tensor
INDEX = Obj(required={"weight_map": Dict(Str(max_len=255))})
SOURCE = Obj(required={"config": Obj(), "dtypes": Dict(Str(max_len=16))})
FLOATS = ("F64", "F32", "F16", "BF16")  # what to-hf writes a float32 tensor back as


@dataclass(frozen=True)
class CkptOptions:
    spec: Path
    source: Path  # from-hf: the Hugging Face folder; to-hf: a from-hf folder or a run
    output: Path
    force: bool = False
    shard_bytes: int = SHARD_BYTES
    origin: Path | None = None  # to-hf of a run: the from-hf folder it started from


def _shard(index: Path, name: str, file: str) -> Path:
    """The shard `file` the index names for tensor `name`: a plain file name in the
    index's folder (never a path out of it), and a regular file there."""
    shown = f"{printable(str(index))}: weight_map.{printable(name)}"
    if file in ("", ".", "..") or any(c in file for c in "/\\\0"):
        raise BadInput(f"{shown}: {printable(file)!r} is not a file name in its folder")
    path = index.parent / file
    if not path.exists():
        raise UsageError(f"missing shard {printable(str(path))} named in {index.name}")
    kind = what_it_is(path)
    if kind != "a regular file":
        raise BadInput(f"{shown}: {printable(file)} is {kind}, not a safetensors file")
    return path


def _hf_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (one file, or a sharded set with
    its index)."""
    index = folder / INDEX_FILE
    if os.path.lexists(index):
        weight_map = load_json(index, JSON_LIMIT, INDEX)["weight_map"]
        return {name: _shard(index, name, file) for name, file in weight_map.items()}
    single = folder / "model.safetensors"
    if not single.exists():
        raise UsageError(f"{printable(str(folder))} has no model.safetensors nor {INDEX_FILE}")
    return {name: single for name in read_header(single)[0]}


def from_hf(result, options: CkptOptions) -> int:
    import mindspore as ms

    config_file = options.source / "config.json"
    config = read_config(config_file)
    named = printable(str(config_file))
    model = model_of(config, named)
    quantization = quantization_of(config, named)  # fp8 or none, before the tensors
    _same_layers(model, result, named)
    files = _hf_files(options.source)
    headers = {path: read_header(path) for path in set(files.values())}
    absent = [n for n in hf_names(model) if n not in headers.get(files.get(n), ({},))[0]]
    if absent:
        layer = absent[0].removeprefix("model.layers.").split(".")[0]
        why = "another model?"
        if model.mtp and layer.isdigit() and int(layer) >= model.layers:
            why = (
                f"config.json's num_nextn_predict_layers = {model.mtp} names multi-token "
                "prediction layers the checkpoint does not hold, as a model transformers "
                "saved does not; set it to 0 to convert the main model"
            )
        raise UsageError(
            f"{printable(absent[0])} is not in {printable(str(options.source))} ({why})"
        )
    entries = {name: headers[files[name]][0][name] for name in hf_names(model)}
    shapes = {name: e.shape for name, e in entries.items()}
    for name, shape in hf_shapes(model).items():
        if tuple(shapes[name]) != shape:  # the tensors are another model than config.json's
            raise UsageError(
                f"{printable(str(files[name]))}: {printable(name)} is {list(shapes[name])}, "
                f"config.json makes it {list(shape)} (another model?)"
            )

    # before any data is read; the buffers the Hugging Face model has (DeepSeek-V3's
    # correction bias) with them
    check_tensors(msgen_shapes(model), spec_params(result) | spec_buffers(result))
    # FP8 weights with their block scales: dequantized whole, before any slicing
    reader = hf_tensors(quantization, named, files, headers, hf_names(model))
    load = reader.load
    dtypes = {n: reader.written_as(n, e.dtype, model.dtype) for n, e in entries.items()}

    check_copies(model, load)  # the tied copies, before anything is written

    dtype = {"fp32": ms.float32, "bf16": ms.bfloat16, "fp16": ms.float16}
    param = dtype[result.spec.model.param_dtype.value]
    stages = stage_layouts(result, options.spec)
    forms = Forms("ckpt from-hf", RUN_FORMS)
    inputs = {"the Hugging Face folder": options.source}
    with claim(options.output, inputs, options.force, forms) as held:
        if stages:
            buffers = spec_buffers(result)
            count = _write_ranks(model, load, stages, param, held.staged, held.work, buffers)
            wrote = f"{options.output}/rank_*/{INIT_FILE}: {count} ranks' slices"
        else:
            tensors = (
                (n, ms.Tensor(np.ascontiguousarray(a), dtype=param))
                for n, a in to_msgen(model, load)
            )
            params = [{"name": n, "data": t} for n, t in tensors]
            ms.save_checkpoint(params, str(held.staged / INIT_FILE))
            wrote = f"{options.output / INIT_FILE}: {len(params)} parameters"
        source = {"config": dequantized_config(config), "dtypes": dtypes}
        (held.staged / SOURCE_FILE).write_text(json.dumps(source, indent=1), encoding="utf-8")
    print(f"wrote {printable(wrote)}", file=sys.stderr)
    return EXIT_OK


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


def _write_ranks(
    model: HfModel, load, stages, param, output: Path, work: Path, buffers: Collection[str]
) -> int:
    """Each rank's slices into rank_<r>/model.ckpt, with its stage's strategy file
    beside them (so the folder merges as a run does). Stage by stage, each tensor the
    stage holds is read once and its slice for every rank of the stage appended to that
    rank's file: host memory is one tensor and its slices."""

    for stage in stages:
        needed = {n for n in stage.layouts if not n.startswith(MOMENTS + ("accu_grads.",))}
        # a buffer (the correction bias) is whole on every rank of its op's stage
        needed |= {
            b for b in buffers if any(n.startswith(b.rsplit(".", 1)[0] + ".") for n in needed)
        }
        folders = [output / f"rank_{rank}" for rank in stage.ranks]
        for folder in folders:
            folder.mkdir()
            (folder / STRATEGY_FILE).write_text(stage.text, encoding="utf-8")
        files = [folder / INIT_FILE for folder in folders]
        scratch = work / "slice.ckpt"  # save_checkpoint appends .ckpt otherwise
        for path in files:
            path.write_bytes(b"")
        for name, array in to_msgen(model, load, needed):  # the stage's tensors only
            # the ranks holding each slice (replicas hold the same view), one
            # encoding of it in memory at a time
            holders: dict[tuple, tuple[np.ndarray, list[Path]]] = {}
            for local, path in enumerate(files):
                layout = stage.layouts.get(name)
                cut = array if layout is None else slice_of(array, layout, local)
                key = (cut.__array_interface__["data"][0], cut.shape, cut.strides)
                holders.setdefault(key, (cut, []))[1].append(path)
            for cut, paths in holders.values():
                _append(_ckpt_bytes(name, cut, param, scratch), paths)
        for path in files:
            os.chmod(path, stat.S_IRUSR)  # as save_checkpoint leaves its files
    return sum(len(stage.ranks) for stage in stages)


def _source(path: Path) -> dict:
    """from-hf's source.json: the source config and each tensor's dtype, checked."""
    if not path.is_file():
        raise UsageError(
            f"{printable(str(path))} not found: name the folder from-hf wrote with --from-hf"
        )
    source = load_json(path, JSON_LIMIT, SOURCE)
    for name, kind in source["dtypes"].items():
        if kind not in FLOATS:
            raise BadInput(
                f"{printable(str(path))}: dtypes.{printable(name)}: {printable(kind)!r} is "
                f"not one of {', '.join(FLOATS)}"
            )
    return source


def _same_layers(model: HfModel, result, where: str) -> None:
    """The config's layer count, and its multi-token prediction layers' count, are the
    spec's (its layers, its train.mtp depth): checked before its tensors are named (a
    config of 10^8 layers is not enumerated)."""
    layers = result.spec.model.dims.get("layers")
    if model.layers != layers:
        raise UsageError(f"{where} is not the spec's model: {model.layers} layers, not {layers}")
    chosen = setting(result.spec)
    depth = 0 if chosen is None else chosen.depth
    if model.mtp != depth:
        fix = (
            f"write `mtp = mtp(depth = {model.mtp})` in the spec's train block, or set "
            "num_nextn_predict_layers to 0 in config.json to convert the main model only"
            if model.mtp
            else "the checkpoint holds no multi-token prediction layer to start them from"
        )
        raise UsageError(
            f"{where} is not the spec's model: num_nextn_predict_layers = {model.mtp}, "
            f"the spec's train.mtp has {depth} modules ({fix})"
        )


def _same_model(model: HfModel, result, where: str) -> None:
    """The model a config describes has the spec's parameters, names and shapes (by
    the tensors transformers would give it, converted): checked before anything is
    read, so a config of another model is one line, not a failed conversion."""
    _same_layers(model, result, where)
    try:
        check_tensors(msgen_shapes(model), spec_params(result) | spec_buffers(result))
    except UsageError as exc:
        raise UsageError(f"{where} is not the spec's model: {exc}") from None


def to_hf_command(result, options: CkptOptions) -> int:
    source_file = (options.origin or options.source) / SOURCE_FILE
    source = _source(source_file)
    where = f"{printable(str(source_file))}: config"
    model = model_of(source["config"], where)
    _same_model(model, result, where)  # the config's model is the spec's, or nothing is read
    inputs = {"the checkpoint folder": options.source}
    if options.origin:
        inputs["--from-hf"] = options.origin
    forms = Forms("ckpt to-hf", HF_FORMS)
    with claim(options.output, inputs, options.force, forms) as held:
        # a run's slices merged first
        step, checkpoint = whole_checkpoint(result, options.spec, options.source, held.work)
        saved = load(checkpoint)
        expected = spec_params(result) | spec_buffers(result)
        check_tensors({n: tuple(saved[n].shape) for n in expected if n in saved}, expected)

        def get(name: str) -> np.ndarray:
            if name not in saved:  # a buffer the checkpoint left at its initial zeros
                return np.zeros(expected[name], np.float32)
            return saved[name].float().asnumpy()

        tensors = {}
        for name, array in to_hf(model, get):
            kind = source["dtypes"].get(name, "F32")
            tensors[name] = (from_float32(array, kind), kind)
        shards = _shards(tensors, options.shard_bytes)
        for file, names in shards.items():
            with open(held.staged / file, "wb") as f:
                f.writelines(encode({n: tensors[n] for n in names}, {"format": "pt"}))
        if len(shards) > 1:
            index = {
                "metadata": {"total_size": sum(t[0].nbytes for t in tensors.values())},
                "weight_map": {n: f for f, names in shards.items() for n in sorted(names)},
            }
            (held.staged / INDEX_FILE).write_text(json.dumps(index, indent=2), encoding="utf-8")
        (held.staged / "config.json").write_text(
            json.dumps(source["config"], indent=2), encoding="utf-8"
        )
    at = f"step {step} of " if step else ""
    print(
        f"wrote {printable(str(options.output))}: {len(tensors)} tensors from "
        f"{at}{printable(str(options.source))}",
        file=sys.stderr,
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
