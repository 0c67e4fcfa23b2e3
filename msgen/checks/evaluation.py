"""Where train.py can evaluate: not under a pipeline (MSL514).

train.py's validation runs the network forward only. Under pipeline parallelism that
would be the training `Pipeline` wrapper without its backward pass, but MindSpore's
pipeline pass labels micro-batches only in training graphs (LabelMicroBatch in the
frontend's pipeline_interleave.cc); MindSpore's own `Model` and mindformers evaluate
the bare network instead (train/model.py, `_build_eval_network`; mindformers
trainer/base_trainer.py), a path no test here can run. So a validation set with
pp > 1 is refused until one can be shown.
"""

from __future__ import annotations

from msgen.diagnostics import Diagnostic, error
from msgen.ir.models import Spec


def check_evaluation(spec: Spec) -> list[Diagnostic]:
    """MSL514, one of the training settings' checks (msgen/checks/train.py)."""
    train = spec.train
    if train.valid is None or spec.mesh.pp <= 1:
        return []
    key = "eval_every" if "eval_every" in train.spans else "data"
    return [
        error(
            "MSL514",
            f"a validation set with pp = {spec.mesh.pp}: train.py evaluates only without "
            "a pipeline",
            train.spans.get(key, train.span),
            "remove `valid` and eval_every, or train with pp = 1 (see `msgen explain MSL514`)",
        )
    ]
