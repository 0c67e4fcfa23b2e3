"""RoPE scaling: which scalings a spec may ask for, their parameters, and the one
definition of the frequencies they give.

The arithmetic is `frequencies.rope_frequencies(dim, theta, scaling, params)` ->
(inv_freq float32 [dim // 2], attention_factor): transformers 4.57's
`modeling_rope_utils` (`_compute_default_rope_parameters`,
`_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`,
`_compute_yarn_parameters`). The attention op's emission, the tests' numpy references
and any other op that rotates (MLA's yarn) read it there. This module holds the
parameter rules (no numpy: the compiler imports it).
"""

from __future__ import annotations

import inspect
import math

# name -> (required parameters, optional parameters with their defaults), as an MSL form
# `rope_scaling = name(key = value, ...)` writes them. transformers falls back to
# max_position_embeddings for yarn's original_max_position_embeddings; MSL has no such
# dim, so the spec says it (msgen import hf writes the fallback's value).
SIGNATURES: dict[str, tuple[tuple[str, ...], dict[str, float | bool | None]]] = {
    "linear": (("factor",), {}),
    "llama3": (
        ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
        {},
    ),
    "yarn": (
        ("factor", "original_max_position_embeddings"),
        {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "mscale": None,
            "mscale_all_dim": None,
            "attention_factor": None,
            "truncate": True,
        },
    ),
}

# Scalings transformers has that a training spec cannot use, and why.
REFUSED: dict[str, str] = {
    "dynamic": "dynamic NTK scaling recomputes the frequencies from each sequence's length "
    "at inference, and up to max_position_embeddings it is plain RoPE: write no rope_scaling",
    "longrope": "longrope switches between two per-frequency factor lists by the sequence "
    "length (Phi-3) and needs those lists, which a spec argument does not carry",
}

FLAGS = frozenset({"truncate"})  # parameters written `true` / `false`


class ScalingError(ValueError):
    """A scaling msgen does not take, or its parameters wrong: the diagnostic's `code`
    (MSL116 the scaling, MSL115 a parameter missing or unknown, MSL126 a value), `key`
    the parameter at fault (None: the scaling as a whole) and a hint."""

    def __init__(self, code: str, message: str, key: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.key = key
        self.hint = hint


def resolved(kind: str, given: dict) -> dict[str, float | bool | None]:
    """The parameters of scaling `kind` with its defaults filled in; a refused or unknown
    kind, a missing, unknown or ill-typed parameter raise ScalingError."""
    known = "rope scalings: " + ", ".join(SIGNATURES)
    if kind in REFUSED:
        raise ScalingError(
            "MSL116", f"rope scaling `{kind}` is not supported: {REFUSED[kind]}", hint=known
        )
    if kind not in SIGNATURES:
        raise ScalingError("MSL116", f"unknown rope scaling `{kind}`", hint=known)
    required, optional = SIGNATURES[kind]
    signature = f"{kind}({', '.join(required + tuple(optional))})"
    for key in given:
        if key not in required and key not in optional:
            raise ScalingError(
                "MSL115", f"rope scaling {kind} has no parameter `{key}`", key, signature
            )
    for key in required:
        if key not in given:
            raise ScalingError("MSL115", f"rope scaling {kind} needs `{key}`", None, signature)
    for key, value in given.items():
        if key in FLAGS and not isinstance(value, bool):
            raise ScalingError(
                "MSL126", f"`{key}` of rope scaling {kind} is `true` or `false`", key
            )
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if key not in FLAGS and not (number and math.isfinite(value) and value > 0):
            raise ScalingError(
                "MSL126", f"`{key}` of rope scaling {kind} is a positive number", key
            )
    params = {key: given.get(key, optional.get(key)) for key in (*required, *optional)}
    if kind == "llama3" and params["high_freq_factor"] <= params["low_freq_factor"]:
        raise ScalingError(
            "MSL126",
            "llama3 scaling needs high_freq_factor > low_freq_factor (its smoothing divides "
            "by their difference)",
            "high_freq_factor",
        )
    return params


# What precedes the frequency functions in model.py.
FREQUENCIES_HEAD = (
    "# RoPE's scaled frequencies: msgen's definition (msgen/ops/rope_scaling/frequencies.py),\n"
    "# transformers 4.57's modeling_rope_utils step for step in fp32.\n\n\n"
)


def frequencies_source() -> str:
    """The source of the frequency functions (`frequencies.py` below its imports), as
    generated code carries it; importing it brings numpy, so only emission does."""
    from msgen.ops.rope_scaling import frequencies

    source = inspect.getsource(frequencies)
    return source[source.index("\n\n\ndef ") + 3 :]


def scaled_rope_values(ops) -> dict:
    """What a rope op's cell template needs once for the model: whether any of `ops`
    scales rope, and then the frequencies' source it carries."""
    scaled = any(op.setting("rope_scaling") for op in ops)
    return {
        "rope_scaling": scaled,
        "rope_frequencies": FREQUENCIES_HEAD + frequencies_source() + "\n\n" if scaled else "",
    }
