"""What a `--set` leaves to follow from the rest: by default a what-if keeps the
cluster's devices and the global batch, so `dp` and a written `micro_batches`
are worked out again from the values given, the way a person would redo the
arithmetic by hand. A value given with `--set` is never re-derived, so a list
of flags means the same in any order.
"""

from __future__ import annotations

from msgen.ir.models import Spec

# What each re-derived key follows from; a --set of none of these leaves it alone.
DP_INPUTS = {"mesh.tp", "mesh.pp", "cluster.per_node", "cluster.nodes"}
MICRO_BATCHES_INPUTS = {"mesh.dp", "train.micro_batch", "train.global_batch"} | DP_INPUTS


def rederived(spec: Spec, given: set[str]) -> tuple[list[str], list[str]]:
    """`--set` arguments for the keys that follow from the given ones, and how each
    changes (`dp 4 → 2`). `spec` is lowered with the given values in place."""
    sets: list[str] = []
    changes: list[str] = []
    dp = spec.mesh.dp
    devices = spec.cluster.per_node * len(spec.cluster.nodes)
    per_replica = spec.mesh.tp * spec.mesh.pp
    if (
        "mesh.dp" not in given
        and given & DP_INPUTS
        and per_replica
        and devices % per_replica == 0
        and devices // per_replica != dp
    ):
        dp = devices // per_replica
        sets.append(f"mesh.dp={dp}")
        changes.append(f"dp {spec.mesh.dp} → {dp}")
    written = spec.pipeline.micro_batches
    per_step = spec.train.micro_batch * dp
    if (
        written is not None
        and "pipeline.micro_batches" not in given
        and (given & MICRO_BATCHES_INPUTS or sets)
        and per_step
        and spec.train.global_batch % per_step == 0
        and spec.train.global_batch // per_step != written
    ):
        micro_batches = spec.train.global_batch // per_step
        sets.append(f"pipeline.micro_batches={micro_batches}")
        changes.append(f"micro_batches {written} → {micro_batches}")
    return sets, changes
