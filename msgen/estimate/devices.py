"""The device catalogue: memory, the runtime's share of it, and peak FLOPs.

Seeded from shared/reference/estimator.md. The reserve is what the runtime
holds before training allocates anything (on a 64 GiB 910B it leaves the 58 GiB
MindSpore Transformers recommends as `max_device_memory`).
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 2**30


@dataclass(frozen=True)
class Device:
    name: str
    hbm_bytes: int
    reserve_bytes: int  # runtime reserve: the CANN runtime, or the CUDA context
    peak_flops: float  # dense fp16/bf16 FLOP/s

    @property
    def usable_bytes(self) -> int:
        return self.hbm_bytes - self.reserve_bytes


DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        Device("ascend910b", 64 * GiB, 6 * GiB, 354e12),  # Atlas 800T A2: 910B1/B2
        Device("ascend910b3", 64 * GiB, 6 * GiB, 295e12),
        Device("ascend910b4", 32 * GiB, 3 * GiB, 246e12),
        Device("ascend910a", 32 * GiB, 3 * GiB, 256e12),
        Device("a100_80g", 80 * GiB, 1 * GiB, 312e12),  # the CUDA context; for published runs
        Device("h100_80g", 80 * GiB, 1 * GiB, 989e12),
    )
}
