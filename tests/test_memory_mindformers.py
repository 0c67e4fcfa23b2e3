"""The memory model on two runs that trained for real: MindFormers' LLaMA2-7B and 13B on
8 x Ascend 910B (specs/validation/llama2_*_mindformers.msl; their configurations,
configs/llama2/pretrain_llama2_7b_bf16.yaml and finetune_llama2_13b_bf16.yaml, run with
max_device_memory 59GB, the parallel optimizer at its default level 1,
gradient_accumulation_shard False, parallel_optimizer_comm_recompute False, no offload).

The model-state rows are written out from the parameter counts of the architecture
(LLaMA2's published 6.74 B and 13.02 B) and MindSpore's definitions of level 1
(`hsdp`, mindspore/parallel/auto_parallel.py; set_parallel_optimizer_config,
mindspore/parallel/_auto_parallel_context.py; the AllGather's backward, a
ReduceScatter, ops/_grad_experimental/grad_comm_ops.py): each weight stored as a 1/dp
slice and held whole from its forward AllGather until backward; the gradient the
optimizer gets, a 1/dp slice; the accumulation buffer (7B: 8 micro-batches) whole;
Adam's fp32 m and v sliced. The norms' 8 KiB and 10 KiB weights are under hsdp's 64 KiB
threshold and stay whole. Both runs ran, so both must fit the 910B's budget.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from msgen.analysis.plan import Plan
from msgen.compiler import analyze
from msgen.estimate.memory import GiB, estimate

VALIDATION = Path(__file__).resolve().parents[1] / "specs" / "validation"
DP = 8
FP16 = 2
ADAM = 8  # m and v, fp32


def llama_params(vocab, hidden, ffn, layers) -> tuple[int, int]:
    """(matrices, norm weights): embedding and output layer untied, q/k/v/o, gate/up/down."""
    matrices = 2 * vocab * hidden + layers * (4 * hidden**2 + 3 * hidden * ffn)
    norms = (2 * layers + 1) * hidden
    return matrices, norms


RUNS = {
    "llama2_7b_mindformers.msl": (llama_params(32000, 4096, 11008, 32), 6_738_415_616, True),
    "llama2_13b_mindformers.msl": (llama_params(32000, 5120, 13824, 40), 13_015_864_320, False),
}


@pytest.mark.parametrize("name", RUNS)
def test_mindformers_llama2_runs_fit_with_level_1_model_states(name):
    (matrices, norms), published, accumulates = RUNS[name]
    assert matrices + norms == published
    result = analyze(VALIDATION / name)
    assert result.ok, [d.message for d in result.diagnostics]
    (stage,) = estimate(Plan(result.spec, result.facts)).stages
    assert stage.params == published
    assert stage.weights_bytes == FP16 * (matrices // DP + matrices + norms)
    assert stage.grads_bytes == FP16 * (matrices // DP + norms)
    assert stage.accumulation_bytes == (FP16 * published if accumulates else 0)
    assert stage.optimizer_bytes == ADAM * (matrices // DP + norms)
    assert stage.total_bytes <= 58 * GiB == stage.budget_bytes
