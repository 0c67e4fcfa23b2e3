"""`msgen compile SPEC --rehearsal`: the spec at the smallest dims its mesh allows.

A rehearsal (`train.py --rehearse`) runs the logical model in one CPU process, so the
spec's real dims would not fit a laptop (a 7B model whole needs ~130 GB of host
memory). This keeps everything that decides what a rank builds (every op and layer
kind, the mesh and every split, zero, the loss scale, dropout, flash attention),
computes in fp32 as the CPU must, and halves each dim (`layers` first, `heads` and
`kv_heads` kept, none below FLOOR) for as long as the spec still checks. A step takes
one sequence per micro-batch and replica, and as few micro-batches as still
accumulate (pp of them at least).
"""

from __future__ import annotations

from pathlib import Path

KEPT = ("heads", "kv_heads")  # the attention's grouping and its split over tp
FLOOR = 8  # no dim but `layers` below it: a sequence of 1 would make attention trivial


def rehearsal_sets(path: Path, sets: list[str]) -> tuple[list[str], list[str]]:
    """The `--set` arguments (after the user's own) that make the spec rehearsal-sized,
    and one `key old → new` line per change. The spec must check as given."""
    from msgen.compiler import analyze

    spec = analyze(path, sets).spec
    chosen: dict[str, int | str] = {}
    changes = []

    def checks(trial: dict[str, int | str]) -> bool:
        return analyze(path, [*sets, *(f"{k}={v}" for k, v in trial.items())]).ok

    # The CPU computes in fp32 (its LayerNorm and MatMul kernels take no bf16); the
    # loss scale is pinned first, since its default follows the dtype.
    fp32 = {"train.loss_scale": spec.loss_scale, "model.dtype": "fp32", "model.param_dtype": "fp32"}
    wide = spec.model.dtype.value != "fp32" or spec.model.param_dtype.value != "fp32"
    if wide and checks(fp32):
        chosen |= fp32
    # The fewest micro-batches that still accumulate (each is one more copy of the
    # network in the step's graph), one sequence each per replica.
    given = spec.micro_batches
    for micro_batches in [*range(min(given, 2), given), given]:
        batch = {
            "pipeline.micro_batches": micro_batches,
            "train.micro_batch": 1,
            "train.global_batch": spec.mesh.dp * micro_batches,
        }
        if checks(chosen | batch):
            chosen |= batch
            break
    if chosen.get("train.global_batch", spec.train.global_batch) != spec.train.global_batch:
        changes.append(
            f"micro_batches {given} → {chosen['pipeline.micro_batches']}, global_batch "
            f"{spec.train.global_batch} → {chosen['train.global_batch']}"
        )
    dims = spec.model.dims
    for key in sorted((k for k in dims if k not in KEPT), key=lambda k: (k != "layers", k)):
        value = analyze(path, [*sets, *(f"{k}={v}" for k, v in chosen.items())]).spec.model.dims[
            key
        ]
        start = value
        floor = 1 if key == "layers" else FLOOR
        while (
            value % 2 == 0 and value // 2 >= floor and checks(chosen | {f"model.{key}": value // 2})
        ):
            value //= 2
            chosen[f"model.{key}"] = value
        if value != start:
            changes.append(f"{key} {start} → {value}")
    if wide and "model.dtype" not in chosen and checks(chosen | fp32):
        chosen |= fp32  # fp32 at the full dims was over the budget; at these it fits
    if "model.dtype" in chosen:
        changes.insert(
            0, f"dtype {spec.model.dtype.value} → fp32 (loss_scale {spec.loss_scale} kept)"
        )
    return [f"{k}={v}" for k, v in chosen.items()], changes
