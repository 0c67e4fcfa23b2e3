"""The performance switches the generated train.py sets, decided once from the plan.

mindformers 2.0.0's static-graph configurations for 910B (configs/qwen3, qwen3_moe,
deepseek3, general/llm_pretrain_*_template.yaml) set these through its context
(core/context/build_context.py); msgen sets those its layouts call for, with
MindSpore 2.10's own calls, and docs/parity.md lists every one with its reason,
those msgen leaves out included.

- `jit_level` "O0" on every Ascend device, as every one of those configurations sets
  it. Without it MindSpore picks O2 under a rank table or on the 910A (its
  MsContext::GetJitLevel), and the dropless moe path with ep > 1 cannot run there:
  its MoveTo runs in graph mode at O0 or O1 only (ops/operations/other_ops.py).
- `parallel_speed_up.json`, read by MindSpore's `AutoParallel.transformer_opt`
  (parallel/auto_parallel.py; the keys context.py `_set_speedup_config_path`
  accepts): with tp > 1, `computation_communication_fusion_level` 3 (MC2: the
  backend's mc2_fusion pass turns AllGather + MatMul into AllGatherMatmul and MatMul
  + ReduceScatter into MatmulReduceScatter, forward and backward) on the Atlas A2
  devices, the only catalogue devices its aclnn kernels run on (the pass skips
  ascend910_93 and 310P, and the 910A has no MC2 kernels), when the matmuls compute
  in fp16 or bf16, the only dtypes the pass fuses; and on every Ascend
  device `grad_matmul_communication_overlap` (the tp collectives of backward run
  beside the weight-gradient matmuls, as the time model assumes: msgen/estimate/op_time.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from msgen.analysis.plan import Plan
from msgen.ir.devices import DEVICES
from msgen.ops import OPS

JIT_LEVEL = "O0"  # mindformers 2.0.0's jit_config.jit_level in all its 910B configs
MC2_LEVEL = 3  # fuse forward and backward nodes (1 forward only, 2 backward only)
# the Atlas A2 (910B) devices of the catalogue: MC2's aclnn kernels run on them
MC2_DEVICES = frozenset({"ascend910b", "ascend910b3", "ascend910b4"})
MC2_DTYPES = frozenset({"fp16", "bf16"})  # mc2_fusion.cc IsNodesDTypeSameAndValid
SPEED_UP_FILE = "parallel_speed_up.json"


@dataclass(frozen=True)
class Switches:
    """What train.py sets beyond the layout itself; None or () where it sets nothing."""

    jit_level: str | None
    # parallel_speed_up.json's keys and values, in the file's order
    speed_up: tuple[tuple[str, object], ...]
    # why the jit level is set: its lines for train.py's comment
    jit_reasons: tuple[str, ...] = ()

    @property
    def mc2(self) -> bool:
        return dict(self.speed_up).get("computation_communication_fusion_level", 0) > 0


def counts_to_host(plan: Plan) -> bool:
    """Some op hands collectives their counts on the host (the dropless moe path with
    ep > 1, whose MoveTo needs jit_level O0 or O1): a dropless moe (`Moe.dropless`)."""
    spec = plan.spec
    if spec.mesh.ep <= 1:
        return False
    names = ["network", *(r.layer for r in plan.repeats)]
    return any(
        OPS[of.node.kind].dropless(of.node)
        for name in names
        for of in plan.graph(name).ops.values()
        if of.node.kind == "moe"
    )


def switches(plan: Plan) -> Switches:
    spec = plan.spec
    device = DEVICES.get(spec.cluster.device)
    if device is None or device.target != "Ascend":
        return Switches(None, ())
    reasons = ["mindformers 2.0.0's 910B configurations all set it"]
    if counts_to_host(plan):
        reasons.append("the dropless moe dispatch's MoveTo runs at O0 or O1 only")
    speed_up: list[tuple[str, object]] = []
    if spec.semi_auto and spec.mesh.tp > 1:
        if device.name in MC2_DEVICES and spec.model.dtype in MC2_DTYPES:
            speed_up.append(("computation_communication_fusion_level", MC2_LEVEL))
        speed_up.append(("grad_matmul_communication_overlap", True))
    return Switches(JIT_LEVEL, tuple(speed_up), tuple(reasons))
