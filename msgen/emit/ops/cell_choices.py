"""Which whole template model.py and a helper cell take per concern, chosen once for
the model: a frozen `CellChoices`, as msgen/emit/modes.py chooses train.py's.

A template (templates/model.py.j2, a helper cell's templates/ops/<helper>.py.j2) imports
one template per concern, `templates/<folder>/<concern>/<choice>.py.j2` (folder `model`,
`ops/<helper>`), and calls its macros (the hooks) instead of branching: each template
follows one path. Every choice of a concern defines the same hooks. The op's emitter
(`OpEmitter.helper_values`) or msgen/emit/render.py makes the choice; a second backend
brings its own templates for the same choices.
"""

from __future__ import annotations

from dataclasses import dataclass

# template folder -> concern -> its choices
CONCERNS: dict[str, dict[str, tuple[str, ...]]] = {
    # fusion: model.py gives parameters communication fusion ids (plan.json's fusion_id)
    # or not; lazy_inline: the network's __init__ lazy-inlined on Ascend or not
    "model": {
        "fusion": ("none", "ids"),
        "lazy_inline": ("off", "ascend"),
    },
    # rope: none of the model's attention ops rotates (the composed rotation only), some
    # do (RotaryPositionEmbedding on Ascend), some scale it (rope_scaling's tables)
    "ops/attention": {
        "rope": ("composed", "fused", "scaled"),
        "kernel": ("composed", "flash"),
        "qk_norm": ("none", "rms"),
    },
    "ops/mla": {
        "rope": ("plain", "scaled"),
        "kernel": ("composed", "flash"),
    },
}


@dataclass(frozen=True)
class CellChoices:
    folder: str  # the concerns' folder under templates/ (CONCERNS)
    choices: tuple[tuple[str, str], ...]  # (concern, choice), every concern of the helper

    def __post_init__(self) -> None:
        concerns = CONCERNS[self.folder]
        chosen = dict(self.choices)
        if set(chosen) != set(concerns):
            raise ValueError(f"{self.folder}: choices for {sorted(chosen)}, not {sorted(concerns)}")
        for concern, choice in chosen.items():
            if choice not in concerns[concern]:
                raise ValueError(f"{concern} {choice!r} is none of {concerns[concern]}")

    @classmethod
    def of(cls, folder: str, **choices: str) -> CellChoices:
        return cls(folder, tuple(sorted(choices.items())))

    def template(self, concern: str) -> str:
        """The template of `concern`'s choice, which the folder's parent template imports."""
        if concern not in CONCERNS[self.folder]:
            raise ValueError(f"{self.folder} has no concern {concern!r}")
        return f"{self.folder}/{concern}/{dict(self.choices)[concern]}.py.j2"
