"""FP8 block-quantized checkpoints (DeepSeek-V3's published weights) read as the floats
they stand for, so `ckpt from-hf` trains from them as from any bf16 checkpoint.

The scheme, as its config.json declares it (`quantization_config: {quant_method:
fp8, fmt: e4m3, activation_scheme: dynamic, weight_block_size: [128, 128]}`): a
linear weight W [rows, cols] is stored as float8_e4m3fn codes Q (safetensors dtype
F8_E4M3), with a companion `<name>_scale_inv` S [ceil(rows/bm), ceil(cols/bn)] of
fp32, one number per bm x bn block, the last blocks of a dim ragged when bm or bn
does not divide it. The weight is

    W[i, j] = float32(Q[i, j]) * S[i // bm, j // bn]        (an fp32 product)

as DeepSeek-V3's `inference/kernel.py` (`weight_dequant_kernel`: `x * s`, the scale
of block (pid_m, pid_n) at `s_ptr + pid_m * cdiv(N, BLOCK) + pid_n`, masked at the
edges) and `inference/fp8_cast_bf16.py` (every 1-byte weight with its
`weight_name + "_scale_inv"`) define it, and transformers 4.57's
`integrations/finegrained_fp8.py` (FP8Linear: `weight_scale_inv` of
`ceil(out/bm) x ceil(in/bn)`, multiplied in as the matmul's weight scale) reads it.
The product is rounded once to fp32, then to the run's parameter dtype as every
other tensor is (msgen.hf.ckpt).

E4M3FN (OCP 8-bit floating point, the "FN" variant torch.float8_e4m3fn is): 1 sign
bit, 4 exponent bits of bias 7, 3 mantissa bits; exponent 0 is subnormal
(m/8 * 2^-6); no infinities; S.1111.111 (0x7F, 0xFF) is NaN; the largest value 448.
Decoded by a 256-entry table built from that definition (numpy only).

What transformers 4.57 does not read is refused by name rather than guessed: a
quant_method other than fp8, an activation_scheme other than dynamic
(FineGrainedFP8Config.post_init), DeepSeek's `fmt` other than e4m3 (an e5m2 checkpoint
has F8_E5M2 tensors, which msgen does not read).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from msgen.base.readers import BadInput, Int, List, Obj, Str
from msgen.base.status import UsageError
from msgen.diagnostics import printable
from msgen.hf.tensors import Entry, as_float32, read_tensor

CODED = "F8_E4M3"  # the safetensors dtype of float8_e4m3fn
SCALE_SUFFIX = "_scale_inv"  # fp8_cast_bf16.py: f"{weight_name}_scale_inv"
SCALE_DTYPES = ("F32", "BF16", "F16")  # exact in fp32; DeepSeek-V3's are F32
BLOCK_DEFAULT = (128, 128)  # FineGrainedFP8Config's weight_block_size
# what to-hf writes a dequantized weight back as: the config's dtype (bf16 for
# DeepSeek-V3, as fp8_cast_bf16.py writes it); never requantized
WRITTEN_AS = {"fp32": "F32", "bf16": "BF16", "fp16": "F16"}

QUANTIZATION = Obj(
    required={"quant_method": Str(max_len=64)},
    optional={
        "fmt": Str(max_len=64),
        "activation_scheme": Str(max_len=64),
        "weight_block_size": List(Int(1, 1 << 20), max_len=2),
    },
)


def _e4m3fn_table() -> np.ndarray:
    """code -> its value as fp32, for all 256 codes (the definition above)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exponent = (codes >> 3) & 0xF
    mantissa = (codes & 0x7) / 8.0
    magnitude = np.where(
        exponent == 0, mantissa * 2.0**-6, (1.0 + mantissa) * 2.0 ** (exponent - 7.0)
    )
    values = sign * magnitude
    values[(codes & 0x7F) == 0x7F] = np.nan
    return values.astype(np.float32)


E4M3FN = _e4m3fn_table()


def decode(codes: np.ndarray) -> np.ndarray:
    """float8_e4m3fn codes (uint8, as msgen.hf.tensors reads F8_E4M3) as fp32."""
    return E4M3FN[codes]


def scale_shape(shape: tuple[int, ...], block: tuple[int, int]) -> tuple[int, ...]:
    """The scale grid a [rows, cols] weight has in blocks of `block` (ragged last
    blocks count)."""
    return tuple(-(-n // b) for n, b in zip(shape, block, strict=True))


def dequantize(codes: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """W = float32(Q) * S per block, in fp32; one block-row of the scale broadcast at a
    time, so memory is the fp32 weight and one row of scales."""
    values = decode(codes)
    rows, cols = block
    for i, scales in enumerate(np.asarray(scale_inv, np.float32)):
        values[i * rows : (i + 1) * rows] *= np.repeat(scales, cols)[: values.shape[1]]
    return values


@dataclass(frozen=True)
class Quantization:
    block: tuple[int, int]


def quantization_of(config: dict, where: str) -> Quantization | None:
    """The config's quantization_config, checked; None when it has none."""
    given = config.get("quantization_config")
    if given is None:
        return None
    q = QUANTIZATION.check(given, where, "quantization_config")
    key = f"{where}: quantization_config"
    if q["quant_method"] != "fp8":
        raise UsageError(
            f"{key}.quant_method {printable(q['quant_method'])!r}: msgen reads fp8 "
            "block-quantized checkpoints only; dequantize the weights first"
        )
    if q.get("fmt", "e4m3") != "e4m3":
        raise UsageError(
            f"{key}.fmt {printable(q['fmt'])!r} is not supported: msgen reads float8 "
            "e4m3 (DeepSeek-V3's fmt) only"
        )
    if q.get("activation_scheme", "dynamic").lower() != "dynamic":
        raise UsageError(
            f"{key}.activation_scheme {printable(q['activation_scheme'])!r}: transformers "
            "4.57 reads dynamic only (FineGrainedFP8Config)"
        )
    block = tuple(q.get("weight_block_size", BLOCK_DEFAULT))
    if len(block) != 2:
        raise BadInput(f"{key}.weight_block_size: {len(block)} numbers, not [rows, cols]")
    return Quantization((block[0], block[1]))


@dataclass(frozen=True)
class HfTensors:
    """The Hugging Face folder's tensors as fp32, FP8 weights dequantized with their
    scales: `files` (name -> file), `headers` (file -> read_header), `scales` (each
    FP8 weight -> its scale tensor), `block` (None: nothing is quantized)."""

    files: dict[str, Path]
    headers: dict[Path, tuple]
    scales: dict[str, str]
    block: tuple[int, int] | None

    def _read(self, name: str) -> tuple[np.ndarray, str]:
        return read_tensor(self.files[name], name, self.headers[self.files[name]])

    def load(self, name: str) -> np.ndarray:
        array, dtype = self._read(name)
        if name not in self.scales:
            return as_float32(array, dtype)
        scale, scale_dtype = self._read(self.scales[name])
        assert self.block is not None  # a scale is found only under a quantization_config
        return dequantize(array, as_float32(scale, scale_dtype), self.block)

    def written_as(self, name: str, dtype: str, model_dtype: str) -> str:
        """The dtype to-hf writes `name` back as: its own, or the config's for an FP8
        weight."""
        return WRITTEN_AS[model_dtype] if name in self.scales else dtype


def hf_tensors(
    quant: Quantization | None, where: str, files: dict[str, Path], headers: dict, names: list
) -> HfTensors:
    """The model's tensors `names` of the folder (whose config, named `where`, has
    `quant`), with each FP8 weight's scale found and its shape held against the
    config's blocks before any data is read."""
    scales: dict[str, str] = {}
    for name in names:
        entry: Entry = headers[files[name]][0][name]
        scale_name = name + SCALE_SUFFIX
        shown = f"{printable(str(files[name]))}: {printable(name)}"
        if entry.dtype != CODED:
            if scale_name in files:
                raise UsageError(
                    f"{shown} is {entry.dtype} and has a {SCALE_SUFFIX}: only {CODED} "
                    "weights are scaled (a half-converted checkpoint?)"
                )
            continue
        if quant is None:
            raise UsageError(
                f"{shown} is {CODED}, and {where} has no quantization_config to say how "
                "it is scaled"
            )
        if len(entry.shape) != 2:
            raise UsageError(f"{shown} is {CODED}{list(entry.shape)}: only 2-D weights are")
        if scale_name not in files:
            raise UsageError(f"{shown} is {CODED} without its scale {printable(scale_name)}")
        scale: Entry | None = headers[files[scale_name]][0].get(scale_name)
        at = f"{printable(str(files[scale_name]))}: {printable(scale_name)}"
        if scale is None:
            raise UsageError(f"{at}: no such tensor in that file (named in the index)")
        want = scale_shape(entry.shape, quant.block)
        if scale.shape != want:
            raise UsageError(
                f"{at} is {list(scale.shape)}: {printable(name)} {list(entry.shape)} in "
                f"blocks of {list(quant.block)} has {list(want)}"
            )
        if scale.dtype not in SCALE_DTYPES:
            raise UsageError(f"{at} is {scale.dtype}, not one of {', '.join(SCALE_DTYPES)}")
        scales[name] = scale_name
    return HfTensors(files, headers, scales, quant.block if quant else None)


def dequantized_config(config: dict) -> dict:
    """The config to-hf writes: the weights are dequantized, so no quantization_config
    (transformers would otherwise load them as FP8)."""
    return {k: v for k, v in config.items() if k != "quantization_config"}
