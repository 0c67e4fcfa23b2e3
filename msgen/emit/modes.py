"""How train.py's step is wired, chosen once from the plan: a frozen `TrainMode`.

A mode names one whole template per concern of the step, and train.py.j2 imports the
three it names (`templates/train/<concern>/<choice>.py.j2`); the shared templates call
their macros (the hooks) instead of branching on the mesh, the micro-batches or the
loss scale. The concerns and their choices:

- **wiring**, how the ranks run: `data_parallel` (MindSpore's data-parallel mode, every
  rank the whole model; a mesh that splits only the batch, `Spec.semi_auto` false) or
  `semi_auto` (AutoParallel with the shard strategies of model.py, a strategy file,
  each rank saving its slices, `--rehearse`).
- **reducer**, where the step finds its gradients: `replicas` (data parallel: averaged
  over the replicas by nn.DistributedGradReducer, the loss too), `accumulated`
  (semi-auto over several micro-batches or stages: the mirrors or `accu_grads`,
  train.py's GradReducer) or `none` (semi-auto, one micro-batch and one stage: the
  backward pass returns each gradient reduced).
- **loss_scale**: `none`, `static` (a fixed factor) or `dynamic` (amp's
  DynamicLossScaler).

Beside them, the cell that runs a step's micro-batches (`Pipeline` for pp > 1, else
`GradAccumulation`). A second backend brings its own templates for the same choices.
"""

from __future__ import annotations

from dataclasses import dataclass

from msgen.analysis.gradients import reads_accumulated
from msgen.checks.reserved import MICRO_CELLS

WIRINGS = ("data_parallel", "semi_auto")
REDUCERS = ("replicas", "accumulated", "none")
LOSS_SCALES = ("none", "static", "dynamic")
CONCERNS = ("wiring", "reducer", "loss_scale")


@dataclass(frozen=True)
class TrainMode:
    wiring: str  # WIRINGS
    reducer: str  # REDUCERS
    loss_scale: str  # LOSS_SCALES
    micro_cell: str  # Pipeline | GradAccumulation (mindspore.parallel.nn)

    def __post_init__(self) -> None:
        for concern, choices in zip(CONCERNS, (WIRINGS, REDUCERS, LOSS_SCALES), strict=True):
            if getattr(self, concern) not in choices:
                raise ValueError(f"{concern} {getattr(self, concern)!r} is none of {choices}")
        if (self.wiring == "data_parallel") != (self.reducer == "replicas"):
            raise ValueError(f"reducer {self.reducer!r} does not go with {self.wiring!r}")

    @classmethod
    def of(cls, spec, loss_scale: str) -> TrainMode:
        """The mode of a checked spec and its loss scale's kind (TrainSpec.loss_scale).
        A data-parallel step of several micro-batches is one graph (GradAccumulation sums
        them); semi-auto parallel accumulates in `accu_grads` where the analysis says
        (msgen/analysis/gradients.py, reads_accumulated)."""
        if not spec.semi_auto:
            reducer = "replicas"
        elif reads_accumulated(spec):
            reducer = "accumulated"
        else:
            reducer = "none"
        return cls(
            wiring="semi_auto" if spec.semi_auto else "data_parallel",
            reducer=reducer,
            loss_scale=loss_scale,
            micro_cell=MICRO_CELLS[spec.mesh.pp > 1],
        )

    def template(self, concern: str) -> str:
        """The template of `concern`'s choice, which train.py.j2 imports."""
        if concern not in CONCERNS:
            raise ValueError(f"no concern {concern!r}: one of {CONCERNS}")
        return f"train/{concern}/{getattr(self, concern)}.py.j2"
