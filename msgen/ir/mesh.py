"""The mesh as ranks: its one owner (as torchtitan's `ParallelDims`). Every
communicator's rank groups, which servers each spans, and each axis's rank stride are
computed here and nowhere else; plan.json lists the groups, the estimate reads which
link a group uses, and the generated code's own rank arithmetic is tested against them.

The rank order is Megatron-LM's (megatron/core/parallel_state.py: tp innermost, then
ep, then the expert data-parallel dim, the pipeline stage outermost):

    rank = ((stage * dp / ep + edp_index) * ep + ep_index) * tp + tp_index
         = (stage * dp + dp_index) * tp + tp_index,   dp_index = edp_index * ep + ep_index

so ep is carved out of dp innermost: an ep group is ep ranks tp apart, inside a server
whenever ep * tp divides the devices per server, and the dense layers see the plain
`(stage * dp + dp_index) * tp + tp_index` order. Servers take consecutive ranks
(`server = rank // per_node`).

Templates print what this owner computes (the strides, each stage's and each node's
ranks, the strategy files' device matrices). Three pieces of generated code still find
a rank's place at run time, since one file serves every rank; tests hold each to this
owner: train.py's stage and dp index, from the strides printed here, and model.py's
`expert_ranks`, from the stage's device matrix the moe op lays (msgen/ops/moe_geometry.py
`devices`, which asks this owner; tests/test_mesh.py), and rank_table.sh's RANK_ID, from
its NODE_RANK (tests/test_launch.py: hccl.json's).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from math import prod

# The coordinates of a rank, outermost first.
COORDINATES = ("pp", "edp", "ep", "tp")
# The coordinates each communicator's group varies over: "dp" is the expert
# data-parallel dim and ep together, "edp" the ranks holding the same experts.
AXES = {"dp": ("edp", "ep"), "tp": ("tp",), "pp": ("pp",), "ep": ("ep",), "edp": ("edp",)}
LISTED = ("dp", "tp", "pp", "ep")  # the communicators plan.json lists (and edp with ep > 1)
STAGE = ("edp", "ep", "tp")  # the coordinates of a rank inside its pipeline stage


@cache
def replica_axes(split) -> tuple[str, ...]:
    """The coordinates of a stage that a tensor split so (per dim, the axis names
    splitting it: `(("tp",), ())`) leaves unused: the devices of a stage that differ
    only along them hold the same slice. A split over dp uses edp and ep, over ep
    ep alone, so experts split over ep are held by the edp ranks (times tp when whole
    over it)."""
    used = {c for axes in split for axis in axes for c in AXES[axis]}
    return tuple(c for c in STAGE if c not in used)


@dataclass(frozen=True)
class RankMesh:
    dp: int
    tp: int
    pp: int = 1
    ep: int = 1
    per_node: int = 1  # devices per server

    @classmethod
    def of(cls, spec) -> RankMesh:
        """The mesh of a checked spec, its servers of `cluster.per_node` devices."""
        m = spec.mesh
        return cls(m.dp, m.tp, m.pp, m.ep, max(1, spec.cluster.per_node))

    @classmethod
    def of_plan(cls, doc: dict) -> RankMesh:
        """The mesh plan.json records (its `mesh` and `per_node`)."""
        m = doc["mesh"]
        return cls(m["dp"], m["tp"], m["pp"], m.get("ep", 1), doc.get("per_node", 1))

    @classmethod
    def of_sizes(cls, sizes: dict[str, int]) -> RankMesh:
        """The mesh of axis sizes ("dp", "tp", "pp", "ep"; a missing one is 1), on
        one server (which server a group spans is then not asked)."""
        return cls(*(sizes.get(a, 1) for a in ("dp", "tp", "pp", "ep")))

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def shape(self) -> dict[str, int]:
        """Each coordinate's size, outermost first."""
        return {"pp": self.pp, "edp": self.dp // self.ep, "ep": self.ep, "tp": self.tp}

    def stride(self, coordinate: str) -> int:
        """Ranks between neighbours along a coordinate (tp 1, ep tp, edp ep * tp,
        pp dp * tp)."""
        shape = self.shape
        inner = COORDINATES[COORDINATES.index(coordinate) + 1 :]
        return prod(shape[c] for c in inner)

    def axis_stride(self, axis: str) -> int:
        """Ranks between neighbours along a communicator's axis, its innermost
        coordinate's stride: dp tp (ep is dp's innermost part), pp dp * tp."""
        return self.stride(AXES[axis][-1])

    def size(self, axes: str | tuple[str, ...], without: str | tuple[str, ...] = ()) -> int:
        """Ranks in one group over `axes` (an axis name or a tuple of them), less the
        coordinates `without` varies: over dp without ep is dp / ep (ep is dp's
        innermost part), the ep groups one dp group holds."""
        dropped = set(_coordinates(without))
        return prod(self.shape[c] for c in _coordinates(axes) if c not in dropped)

    def rank(self, stage: int = 0, dp_index: int = 0, tp_index: int = 0) -> int:
        return (stage * self.dp + dp_index) * self.tp + tp_index

    def stage_of(self, rank: int) -> int:
        """The pipeline stage `rank` belongs to (stages are outermost)."""
        return rank // self.stride("pp")

    def stage_ranks(self, stage: int) -> range:
        """The ranks of a pipeline stage, in the order of its strategy file's device
        matrix (row-major: a stage's local rank is its place here)."""
        start = stage * self.stride("pp")
        return range(start, start + self.stride("pp"))

    def first_ranks(self) -> tuple[int, ...]:
        """The first rank of each pipeline stage."""
        return tuple(self.rank(stage=s) for s in range(self.pp))

    def dev_matrix(self, expert: bool) -> list[int]:
        """The device matrix a stage's strategy-file layouts use, outermost first:
        [dp / ep, ep, tp] for expert tensors, [dp, tp] for the rest."""
        return [self.dp // self.ep, self.ep, self.tp] if expert else [self.dp, self.tp]

    def coordinates(self, rank: int) -> dict[str, int]:
        """A rank's index along each coordinate, outermost first."""
        return {c: rank // self.stride(c) % n for c, n in self.shape.items()}

    def group(self, axes: str | tuple[str, ...], rank: int) -> tuple[int, ...]:
        """The ranks of `rank`'s group over `axes`, in rank order (which is the order
        of their index along the axes: a group's ranks never interleave)."""
        varied = _coordinates(axes)
        at = self.coordinates(rank)
        base = sum(at[c] * self.stride(c) for c in COORDINATES if c not in varied)
        offsets = [0]
        for c in varied:
            step = self.stride(c)
            offsets = [o + i * step for o in offsets for i in range(self.shape[c])]
        return tuple(sorted(base + o for o in offsets))

    def expert_group(self, rank: int) -> tuple[tuple[int, ...], int]:
        """`rank`'s expert-parallel group and its index there (its ep coordinate): what
        the generated moe cell creates its all-to-all group from
        (templates/ops/moe_permute.py.j2 `expert_ranks`, tested against this)."""
        return self.group("ep", rank), self.coordinates(rank)["ep"]

    def replicas(self, split) -> int:
        """How many devices of a stage hold the same slice of a tensor split so."""
        return self.size(replica_axes(split))

    def replica_group(self, split, rank: int) -> tuple[int, ...]:
        """The ranks holding the same slice as `rank` of a tensor split so, in rank
        order: a parameter's mirror group, and the parallel optimizer's."""
        return self.group(replica_axes(split), rank)

    def groups(self, axes: str | tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """Every group over `axes`, by first rank."""
        return _groups(self, _coordinates(axes))

    def server(self, rank: int) -> int:
        return rank // self.per_node

    def server_ranks(self, server: int) -> range:
        """The ranks on a server (servers take consecutive ranks)."""
        return range(server * self.per_node, (server + 1) * self.per_node)

    def servers_ranks(self) -> tuple[range, ...]:
        """Each server's ranks, by server index (the NODE_RANK the launch scripts take,
        the rank table's `server_list` order), its devices in device-index order."""
        return tuple(self.server_ranks(s) for s in range(self.devices // self.per_node))

    def servers(self, group: tuple[int, ...]) -> tuple[int, ...]:
        """The servers a group's ranks are on."""
        return tuple(sorted({self.server(r) for r in group}))

    def spans(self, axes: str | tuple[str, ...]) -> int:
        """The most servers one group over `axes` spans."""
        return max(len(self.servers(g)) for g in self.groups(axes))

    def in_server(self, axes: str | tuple[str, ...]) -> bool:
        """Whether every group over `axes` lies inside one server."""
        return _in_server(self, _coordinates(axes))

    def sends_in_server(self, stage: int) -> bool:
        """Whether the pipeline sends between `stage` and its neighbouring stages (each
        rank to the rank of the same dp and tp index) all stay inside a server."""
        step, per_stage = self.stride("pp"), self.dp * self.tp
        lo, hi = max(0, stage - 1) * per_stage, min(stage + 1, self.pp - 1) * per_stage
        return all(self.server(r) == self.server(r + step) for r in range(lo, hi))

    def listed(self) -> dict[str, list[list[int]]]:
        """The groups plan.json lists: dp, tp, pp, ep, and with ep > 1 the experts'
        data-parallel groups (edp), each a list of rank lists."""
        axes = LISTED + (("edp",) if self.ep > 1 else ())
        return {a: [list(g) for g in self.groups(a)] for a in axes}


@cache
def _coordinates(axes: str | tuple[str, ...]) -> tuple[str, ...]:
    names = (axes,) if isinstance(axes, str) else axes
    varied = {c for a in names for c in AXES[a]}
    return tuple(c for c in COORDINATES if c in varied)


def _bases(mesh: RankMesh, varied: tuple[str, ...]) -> list[int]:
    """The first rank of each group varying `varied`, in rank order."""
    bases = [0]
    for c in COORDINATES:
        if c not in varied:
            step = mesh.stride(c)
            bases = [b + i * step for b in bases for i in range(mesh.shape[c])]
    return bases


@cache
def _groups(mesh: RankMesh, varied: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    first = mesh.group(varied, 0)
    return tuple(tuple(b + r for r in first) for b in _bases(mesh, varied))


@cache
def _in_server(mesh: RankMesh, varied: tuple[str, ...]) -> bool:
    """Each group's first and last rank on one server (servers hold consecutive
    ranks), without listing the groups' members."""
    extent = sum((mesh.shape[c] - 1) * mesh.stride(c) for c in varied)
    return all(mesh.server(b) == mesh.server(b + extent) for b in _bases(mesh, varied))
