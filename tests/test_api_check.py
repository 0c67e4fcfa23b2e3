"""The generated Python against the installed MindSpore 2.10.

API: every generated `.py` (generated/*/ and the compiled test specs) is parsed with
`ast`; every mindspore module or name it imports, every attribute chain it reaches
from those (`ops.MatMul`, `ms.set_context`, `ops.MatMul().shard(...).recompute`),
must resolve in the installed package, and every call of a mindspore callable must
bind to its signature.

Shard strategies: the network of each compiled spec is instantiated (gpt7b and
llama13b under `no_init_parameters`) and run once on a logical micro-batch
(micro_batch * dp sequences) while every primitive call is recorded. Each
primitive with a strategy (`prim.attrs["in_strategy"]`, set by `.shard`) must have
one strategy per tensor input it is called with, each as long as that input's
rank, each entry dividing its logical dim, and each a split of the stage's devices;
and the splits MindSpore's parallel ops insist on must agree (a matmul's
contracted dims, elementwise operands, normalised, sliced and concatenated dims
whole). A primitive laid by Layouts (`prim.attrs["in_layout"]`) is checked on the
slices its tensor maps cut, its inputs over one device matrix of the stage's
devices, and a matmul's contracted dims mapped to the same device dims (MindSpore's
MatMul::CheckInputLayout). The tiny specs run for real (PyNative); the big ones run a shape-only
trace (each primitive returns an object of the shape it would produce, nothing is
computed), which is checked against the real trace on the tiny specs. The shape
trace pretends to be on Ascend, so the flash-attention path is checked too.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import threading
from contextlib import contextmanager
from dataclasses import dataclass, replace
from math import prod
from pathlib import Path

import numpy as np
import pytest

from tests.emit_fixtures import BIG, ROOT, TINY, compiled, load, network_class, plan, plan_json

# hostinfo.py is msgen.hostinfo carried as it is: the standard library only.
GENERATED = sorted(p for p in (ROOT / "generated").glob("*/*.py") if p.name != "hostinfo.py")
# tests/specs/*.msl
COMPILED_TEST_SPECS = ("tiny_mixed", "tiny_interleaved", "tiny_dp", "tiny_moe", "tiny_mtp_moe")


# API check --------------------------------------------------------------------------

UNKNOWN = object()


@dataclass(frozen=True)
class Instance:
    """What calling a mindspore class gives: an object of that class."""

    cls: type


@dataclass(frozen=True)
class Method:
    instance: Instance
    name: str
    function: object


def returns_self(cls: type, method: str) -> bool:
    """Methods documented to return their object, so `.shard(...).recompute()` chains go on."""
    from mindspore import nn
    from mindspore.ops import Primitive

    if issubclass(cls, Primitive):
        return method in ("shard", "recompute")
    return issubclass(cls, nn.Cell) and method == "set_comm_fusion"


class ApiChecker:
    def __init__(self, source: str, filename: str, folder: Path | None = None):
        self.tree = ast.parse(source, filename)
        self.filename = filename
        self.folder = folder
        self.bound: dict[str, object] = {}
        self.problems: list[str] = []
        self._memo: dict[int, object] = {}

    def problem(self, node: ast.AST, message: str) -> None:
        self.problems.append(f"{self.filename}:{node.lineno}: {message}")

    def run(self) -> list[str]:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                self._import(node)
            elif isinstance(node, ast.ImportFrom):
                self._import_from(node)
        for node in ast.walk(self.tree):
            if isinstance(node, (ast.Attribute, ast.Call)):
                self.resolve(node)
        return list(dict.fromkeys(self.problems))

    def _import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] != "mindspore":
                continue
            try:
                module = importlib.import_module(alias.name)
            except ImportError as exc:
                self.problem(node, f"import {alias.name}: {exc}")
                continue
            if alias.asname:
                self.bound[alias.asname] = module
            else:
                self.bound["mindspore"] = importlib.import_module("mindspore")

    def _import_from(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module:
            return
        if node.module.split(".")[0] != "mindspore":
            self._import_local(node)
            return
        try:
            module = importlib.import_module(node.module)
        except ImportError as exc:
            self.problem(node, f"from {node.module} import ...: {exc}")
            return
        for alias in node.names:
            try:
                found = getattr(module, alias.name)
            except AttributeError:
                try:
                    found = importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    self.problem(node, f"from {node.module} import {alias.name}: no such name")
                    continue
            self.bound[alias.asname or alias.name] = found

    def _import_local(self, node: ast.ImportFrom) -> None:
        """`from model import TinyGpt` in train.py: the name is defined by its model.py."""
        if self.folder is None or not (self.folder / f"{node.module}.py").is_file():
            return
        tree = ast.parse((self.folder / f"{node.module}.py").read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))} | {
            t.id
            for n in tree.body
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for alias in node.names:
            if alias.name not in defined:
                self.problem(node, f"from {node.module} import {alias.name}: not defined there")

    def resolve(self, node: ast.AST) -> object:
        key = id(node)
        if key not in self._memo:
            self._memo[key] = self._resolve(node)
        return self._memo[key]

    def _resolve(self, node: ast.AST) -> object:
        if isinstance(node, ast.Name):
            return self.bound.get(node.id, UNKNOWN)
        if isinstance(node, ast.Attribute):
            return self._attribute(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        return UNKNOWN

    def _attribute(self, node: ast.Attribute) -> object:
        base = self.resolve(node.value)
        if base is UNKNOWN or isinstance(base, Method):
            return UNKNOWN
        chain = ast.unparse(node)
        if isinstance(base, Instance):
            function = getattr(base.cls, node.attr, UNKNOWN)
            if function is UNKNOWN:
                self.problem(
                    node, f"{chain}: {base.cls.__qualname__} has no attribute {node.attr!r}"
                )
                return UNKNOWN
            return Method(base, node.attr, function)
        try:
            return getattr(base, node.attr)
        except AttributeError:
            self.problem(
                node, f"{chain}: {getattr(base, '__name__', base)!s} has no attribute {node.attr!r}"
            )
            return UNKNOWN

    def _call(self, node: ast.Call) -> object:
        func = self.resolve(node.func)
        if func is UNKNOWN:
            return UNKNOWN
        target = func.function if isinstance(func, Method) else func
        self._bind(node, target, bound_self=isinstance(func, Method))
        if isinstance(func, Method):
            return func.instance if returns_self(func.instance.cls, func.name) else UNKNOWN
        if isinstance(func, type):
            return Instance(func)
        return UNKNOWN

    def _bind(self, node: ast.Call, target, bound_self: bool) -> None:
        if any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords
        ):
            return
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):
            return
        args = [None] * (len(node.args) + bound_self)
        try:
            signature.bind(*args, **{k.arg: None for k in node.keywords})
        except TypeError as exc:
            self.problem(node, f"{ast.unparse(node.func)}{signature}: {exc}")


def generated_files() -> list[str]:
    """`generated/<model>/<file>` of the committed tree, `compiled/<model>/<file>` of the
    test specs (compiled when the test runs)."""
    files = [p.relative_to(ROOT).as_posix() for p in GENERATED]
    files += [
        f"compiled/{name}/{f}" for name in COMPILED_TEST_SPECS for f in ("model.py", "train.py")
    ]
    return files


@pytest.mark.parametrize("file", generated_files())
def test_generated_code_uses_only_real_mindspore_api(file):
    where, name, filename = file.split("/")
    folder = ROOT / "generated" / name if where == "generated" else compiled(name)
    checker = ApiChecker((folder / filename).read_text(), file, folder)
    assert checker.run() == []
    assert {"nn", "ops"} <= set(checker.bound), "the check saw no mindspore import"


def test_the_generated_tree_is_checked():
    names = {p.parent.name for p in GENERATED}
    assert {"gpt7b", "llama13b", "tiny", "tiny_llama"} <= names
    assert {p.name for p in GENERATED} == {"model.py", "train.py"}


def test_the_api_check_catches_what_does_not_exist(tmp_path):
    source = "\n".join(
        [
            "import mindspore as ms",  # 1
            "import mindspore.nothing_here",  # 2
            "from mindspore import nn, ops, NoSuchThing",  # 3
            "from mindspore.nn import transformer",  # 4
            "x = ops.CrossEntropy()",  # 5
            "y = ops.MatMul().shard(((1, 1), (1, 1))).recompute().no_such_method()",  # 6
            "z = ops.matmul(a, b, out=c)",  # 7
            "w = nn.AdamWeightDecay(p, 1e-3, allreduce_fusion_config=[1])",  # 8
            "ms.set_context(mode=ms.GRAPH_MODE)",  # 9: fine
            "v = ms.nn.CosineAnnealingLR",  # 10
            "u = ops.Dropout(0.9).shard(((1,),))",  # 11: fine
            "from model import Missing",  # 12
        ]
    )
    (tmp_path / "model.py").write_text("class Present:\n    pass\n")
    problems = ApiChecker(source, "bad.py", tmp_path).run()
    lines = sorted({int(p.split(":")[1]) for p in problems})
    assert lines == [2, 3, 4, 5, 6, 7, 8, 10, 12], problems


# shard strategy check ---------------------------------------------------------------

# Primitives whose Python-number operands become scalar tensors (strategy `()`).
SCALAR_OPERANDS = {"Add", "Sub", "Mul", "RealDiv", "Div", "Maximum", "Minimum"}
ELEMENTWISE = SCALAR_OPERANDS


class Shaped:
    """A stand-in tensor for the shape-only trace: a shape, and reshape."""

    def __init__(self, shape):
        self.shape = tuple(int(n) for n in shape)

    def reshape(self, *shape):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = list(shape)
        if -1 in shape:
            known = prod(n for n in shape if n != -1)
            shape[shape.index(-1)] = prod(self.shape) // known
        assert prod(shape) == prod(self.shape), (self.shape, shape)
        return Shaped(shape)

    def __repr__(self):
        return f"Shaped{self.shape}"


def is_tensor(x) -> bool:
    import mindspore as ms

    return isinstance(x, (ms.Tensor, np.ndarray, Shaped))


def input_shapes(prim, args) -> tuple[tuple[int, ...], ...]:
    """The shapes of the tensor inputs of one call, as MindSpore's parallel ops count them:
    tensors (a tuple of tensors, as Concat takes, counts each), and Python numbers that
    an elementwise op turns into a scalar tensor; axes, shapes, perms and dtypes do not."""
    out = []
    for a in args:
        if a is None:
            continue
        if isinstance(a, (tuple, list)):
            if a and all(is_tensor(x) for x in a):
                out.extend(tuple(x.shape) for x in a)
        elif is_tensor(a):
            out.append(tuple(a.shape))
        elif isinstance(a, (int, float)) and not isinstance(a, bool):
            if type(prim).__name__ in SCALAR_OPERANDS:
                out.append(())
    return tuple(out)


def _same(prim, x, *rest):
    return Shaped(x.shape)


def _broadcast(prim, *xs):
    return Shaped(np.broadcast_shapes(*(getattr(x, "shape", ()) for x in xs)))


def _matmul(prim, x, w):
    m, k = x.shape[::-1] if prim.attrs.get("transpose_a") else x.shape
    k2, n = w.shape[::-1] if prim.attrs.get("transpose_b") else w.shape
    assert k == k2, (x.shape, w.shape)
    return Shaped((m, n))


def _batch_matmul(prim, x, w):
    m, k = x.shape[-2:][::-1] if prim.attrs.get("transpose_a") else x.shape[-2:]
    k2, n = w.shape[-2:][::-1] if prim.attrs.get("transpose_b") else w.shape[-2:]
    assert k == k2, (x.shape, w.shape)
    return Shaped((*np.broadcast_shapes(x.shape[:-2], w.shape[:-2]), m, n))


def _gather(prim, table, ids, axis):
    return Shaped(table.shape[:axis] + ids.shape + table.shape[axis + 1 :])


def _reduce(prim, x, axis=()):
    axes = {a % len(x.shape) for a in ((axis,) if isinstance(axis, int) else axis)}
    axes = axes or set(range(len(x.shape)))
    keep = prim.attrs.get("keep_dims")
    return Shaped([1 if i in axes else n for i, n in enumerate(x.shape) if keep or i not in axes])


def _layernorm(prim, x, gamma, beta):
    axis = prim.attrs["begin_norm_axis"] % len(x.shape)
    stats = x.shape[:axis] + (1,) * (len(x.shape) - axis)
    return Shaped(x.shape), Shaped(stats), Shaped(stats)


def _strided_slice(prim, x, begin, end, strides):
    return Shaped((min(e, n) - b + s - 1) // s for n, b, e, s in zip(x.shape, begin, end, strides))


def _concat(prim, xs):
    axis = prim.attrs["axis"] % len(xs[0].shape)
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    return Shaped(shape)


def _split(prim, x):
    axis, count = prim.attrs["axis"] % len(x.shape), prim.attrs["output_num"]
    shape = list(x.shape)
    shape[axis] //= count
    return tuple(Shaped(shape) for _ in range(count))


def _one_hot(prim, ids, depth, on, off):
    return Shaped((*ids.shape, depth))


def _softmax_ce(prim, logits, target):
    return Shaped(logits.shape[:1]), Shaped(logits.shape)


def _flash(prim, q, k, v, *rest):
    b, n, s, _ = q.shape
    stats = Shaped((b, n, s, 8))
    return stats, stats, Shaped((1,)), Shaped(q.shape)


def _rms_norm(prim, x, gamma):
    rows = x.shape[: len(x.shape) - len(gamma.shape)]
    return Shaped(x.shape), Shaped(rows + (1,) * len(gamma.shape))


def _swiglu(prim, x, dim=-1):
    shape = list(x.shape)
    shape[dim] //= 2
    return Shaped(shape)


def _gen_mask(prim, shape, keep_prob):
    return Shaped((prod(shape) // 8,))


SHAPE_ONLY = {
    **dict.fromkeys(("Cast", "Square", "Rsqrt", "Erf", "Neg", "SiLU", "GeLU", "Softmax"), _same),
    **dict.fromkeys(("Exp", "Log", "ZerosLike", "Sigmoid", "CumSum"), _same),
    **dict.fromkeys(("LessEqual", "GreaterEqual"), _broadcast),
    "Tile": lambda prim, x, times: Shaped(n * t for n, t in zip(x.shape, times, strict=True)),
    "TopK": lambda prim, x, k: (Shaped((*x.shape[:-1], k)), Shaped((*x.shape[:-1], k))),
    **dict.fromkeys(("ReduceMean", "ReduceMax", "ReduceSum"), _reduce),
    "Select": lambda prim, cond, x, y: Shaped(x.shape),
    "MaskedFill": lambda prim, x, mask, value: Shaped(np.broadcast_shapes(x.shape, mask.shape)),
    "GatherD": lambda prim, x, dim, index: Shaped(index.shape),
    "AssignAdd": lambda prim, variable, value: Shaped(variable.shape),
    **dict.fromkeys(ELEMENTWISE, _broadcast),
    "MatMul": _matmul,
    "BatchMatMul": _batch_matmul,
    "Gather": _gather,
    "LayerNorm": _layernorm,
    "Transpose": lambda prim, x, perm: Shaped(x.shape[i] for i in perm),
    "StridedSlice": _strided_slice,
    "Concat": _concat,
    "Split": _split,
    "Dropout": lambda prim, x: (Shaped(x.shape), Shaped(x.shape)),
    "OneHot": _one_hot,
    "SoftmaxCrossEntropyWithLogits": _softmax_ce,
    "FlashAttentionScore": _flash,
    "DropoutGenMask": _gen_mask,
    "RmsNorm": _rms_norm,
    "Swiglu": _swiglu,
    "RotaryPositionEmbedding": lambda prim, x, cos, sin, mode=0: Shaped(x.shape),
    "Sort": lambda prim, x: (Shaped(x.shape), Shaped(x.shape)),
    "FloorDiv": _broadcast,
    "Ones": lambda prim, shape, dtype: Shaped(shape),
    "GroupedMatmul": lambda prim, x, w, *rest: [Shaped((x[0].shape[0], w[0].shape[-1]))],
    "Morph": lambda prim, *args: prim.__morph_fn__(*args),  # its body, traced
}


@dataclass(frozen=True)
class Call:
    path: str  # attribute path of the primitive in the network, e.g. decoder.0.qkv.matmul
    owner: str  # class of the cell holding it
    prim: object
    shapes: tuple[tuple[int, ...], ...]
    args: tuple  # the call's arguments (the shape-only rules read slices and axes)


def primitives(network) -> dict[int, tuple[str, str, object]]:
    """Every primitive held by the network's cells: id -> (path, owner class, primitive)."""
    found = {}
    for cell_path, cell in network.cells_and_names():
        for attr, prim in cell._primitives.items():
            if prim is not None:
                path = f"{cell_path}.{attr}" if cell_path else attr
                found.setdefault(id(prim), (path, type(cell).__name__, prim))
    return found


@contextmanager
def tracing(network, shape_only: bool):
    """Record every call of the network's primitives (outermost calls only). With
    `shape_only`, primitives and cells compute nothing: each primitive returns
    stand-ins of the shapes it would produce."""
    from mindspore import nn

    found = primitives(network)
    calls: list[Call] = []
    local = threading.local()
    patched: dict[type, object] = {}

    def wrap(cls):
        original = cls.__call__

        def call(self, *args, **kwargs):
            outer = not getattr(local, "depth", 0)
            if outer and id(self) in found:
                path, owner, _ = found[id(self)]
                calls.append(Call(path, owner, self, input_shapes(self, args), args))
            if shape_only:
                rule = SHAPE_ONLY.get(type(self).__name__)
                if rule is None:
                    raise NotImplementedError(f"no shape rule for {type(self).__name__}")
                return rule(self, *args, **kwargs)
            local.depth = getattr(local, "depth", 0) + 1
            try:
                return original(self, *args, **kwargs)
            finally:
                local.depth -= 1

        return call

    for cls in {type(prim) for _, _, prim in found.values()}:
        patched[cls] = cls.__dict__.get("__call__", UNKNOWN)
        cls.__call__ = wrap(cls)
    if shape_only:
        patched[nn.Cell] = nn.Cell.__dict__["__call__"]
        nn.Cell.__call__ = lambda self, *args, **kwargs: self.construct(*args, **kwargs)
    try:
        yield calls
    finally:
        for cls, original in patched.items():
            if original is UNKNOWN:
                del cls.__call__
            else:
                cls.__call__ = original


def _rule_problems(c: Call, strategy) -> list[str]:
    """The splits MindSpore's parallel ops require to agree (by op, as in its *Info classes)."""
    kind = type(c.prim).__name__
    attrs = c.prim.attrs
    out = []

    def whole(i, dim, why):
        if strategy[i][dim] != 1:
            out.append(f"input {i} dim {dim} ({why}) is split {strategy[i][dim]}")

    if kind in ("MatMul", "BatchMatMul"):
        (sx, sw), (x, w) = strategy, c.shapes
        kx = -2 if attrs.get("transpose_a") else -1
        kw = -1 if attrs.get("transpose_b") else -2
        if sx[kx] != sw[kw]:
            out.append(f"contracted dims split {sx[kx]} and {sw[kw]}")
        if kind == "BatchMatMul":
            for a, b, n, m in zip(sx[-3::-1], sw[-3::-1], x[-3::-1], w[-3::-1]):
                if n == m and a != b:
                    out.append(f"batch dims split {sx} vs {sw}")
    elif kind in ELEMENTWISE:
        for d in range(1, max(len(s) for s in c.shapes) + 1):
            splits = {
                s[-d] for s, shape in zip(strategy, c.shapes) if len(shape) >= d and shape[-d] > 1
            }
            if len(splits) > 1:
                out.append(f"operands split differently along dim -{d}: {strategy}")
    elif kind == "LayerNorm":
        axis = attrs["begin_norm_axis"] % len(c.shapes[0])
        for d in range(axis, len(c.shapes[0])):
            whole(0, d, "normalised")
        for i in (1, 2):
            for d in range(len(c.shapes[i])):
                whole(i, d, "gamma/beta")
    elif kind == "RmsNorm":  # RmsNormInfo::CheckStrategy (ops_info/rms_norm_info.cc)
        begin = len(c.shapes[0]) - len(c.shapes[1])
        for d in range(begin, len(c.shapes[0])):
            whole(0, d, "normalised")
        for d in range(len(c.shapes[1])):
            whole(1, d, "gamma")
    elif kind == "Swiglu":  # SwigluInfo is a Softmax over `dim` (ops_info/activation_info.h)
        dim = c.args[1] if len(c.args) > 1 else -1
        whole(0, dim % len(c.shapes[0]), "swiglu dim")
    elif kind == "RotaryPositionEmbedding":
        # head_dim holds the rotated halves; the tables whole (mindformers' strategy,
        # training_graph/base_models/common/embeddings/rope_utils.py)
        whole(0, len(c.shapes[0]) - 1, "head_dim")
        for i in (1, 2):
            for d in range(len(c.shapes[i])):
                whole(i, d, "cos/sin")
        # x is BNSD (batch, heads, rows, head_dim): the kernel reads the tables as
        # 11SD, B1SD or BNSD then (its 2.10 docstring, ops/auto_generate/gen_ops_def.py)
        x, table = c.shapes[0], c.shapes[1]
        if table[2:] != x[2:] or table[:2] not in ((1, 1), (x[0], 1), x[:2]):
            out.append(f"tables {table} are not in a BNSD x's layout (11SD, B1SD, BNSD)")
    elif kind == "Softmax":
        for axis in attrs["axis"]:
            whole(0, axis % len(c.shapes[0]), "softmax axis")
    elif kind == "SoftmaxCrossEntropyWithLogits":
        whole(0, 1, "classes")
        whole(1, 1, "classes")
    elif kind in ("Concat", "Split"):
        axis = attrs["axis"] % len(c.shapes[0])
        for i in range(len(c.shapes)):
            whole(i, axis, f"{kind.lower()} axis")
    elif kind == "StridedSlice":
        _, begin, end, strides = c.args
        for d, (n, b, e, s) in enumerate(zip(c.shapes[0], begin, end, strides)):
            if (b, s) != (0, 1) or e < n:
                whole(0, d, "sliced")
    return out


def strategy_shapes(c: Call) -> tuple[tuple[int, ...], ...]:
    """The shapes MindSpore checks a call's strategies against: the inputs', except
    OneHot's first, which is its output's [n, depth] (parallel/ops_info/onehot_info.cc)."""
    if type(c.prim).__name__ == "OneHot":
        return ((*c.shapes[0], c.args[1]), *c.shapes[1:])
    return c.shapes


def layout_slices(layout: dict) -> tuple[int, ...]:
    """The slices a Layout cuts each tensor dim into: the product of the device dims its
    tensor map names there, counted from the right (mindspore/parallel/shard.py)."""
    matrix = layout["device_matrix"][::-1]
    maps = (m if isinstance(m, tuple) else (m,) for m in layout["tensor_map"])
    return tuple(prod(matrix[i] for i in m if i >= 0) for m in maps)


def _layout_problems(c: Call, layouts, devices: int) -> list[str]:
    """A Layout-laid primitive's own rules: one device matrix over the stage's devices,
    and a matmul's contracted dims on the same device dims (MatMul::CheckInputLayout,
    frontend/parallel/ops_info/matmul_info.cc)."""
    matrices = {tuple(layout["device_matrix"]) for layout in layouts}
    if len(matrices) > 1:
        return [f"inputs laid over different device matrices {sorted(matrices)}"]
    (matrix,) = matrices
    if prod(matrix) != devices:
        return [f"device matrix {matrix} is not the stage's {devices} devices"]
    if type(c.prim).__name__ in ("MatMul", "BatchMatMul"):
        kx = -2 if c.prim.attrs.get("transpose_a") else -1
        kw = -1 if c.prim.attrs.get("transpose_b") else -2
        x, w = (layout["tensor_map"] for layout in layouts)
        if x[kx] != w[kw]:
            return [f"contracted dims mapped to device dims {x[kx]} and {w[kw]}"]
    return []


def strategy_problems(calls: list[Call], devices: int) -> list[str]:
    """What is wrong with the strategies of the recorded calls (empty: nothing)."""
    problems = []
    for c in calls:
        strategy = c.prim.attrs.get("in_strategy")
        layouts = c.prim.attrs.get("in_layout")
        if strategy is None and layouts is None:
            continue
        c = replace(c, shapes=strategy_shapes(c))
        if strategy is None:
            strategy = tuple(layout_slices(layout) for layout in layouts)
            found = _layout_problems(c, layouts, devices)
            name = f"{c.path} ({type(c.prim).__name__} laid {strategy} on {c.shapes})"
            problems += [f"{name}: {p}" for p in found]
        name = f"{c.path} ({type(c.prim).__name__} {strategy} on {c.shapes})"
        if len(strategy) != len(c.shapes):
            problems.append(f"{name}: {len(strategy)} strategies for {len(c.shapes)} inputs")
            continue
        ok = True
        for i, (s, shape) in enumerate(zip(strategy, c.shapes)):
            if len(s) != len(shape):
                problems.append(f"{name}: input {i} has rank {len(shape)}, its strategy {len(s)}")
                ok = False
                continue
            for d, (k, n) in enumerate(zip(s, shape)):
                if k < 1 or n % k:
                    problems.append(f"{name}: input {i} dim {d} ({n}) is not divisible by {k}")
                    ok = False
            if devices % prod(s):
                problems.append(f"{name}: input {i} is split {prod(s)} ways of {devices} devices")
        if ok:
            problems += [f"{name}: {p}" for p in _rule_problems(c, strategy)]
    return list(dict.fromkeys(problems))


def unexercised(network, calls: list[Call]) -> set[str]:
    """Paths of primitives that carry a strategy but were never called."""
    called = {id(c.prim) for c in calls}
    return {
        path
        for key, (path, _, prim) in primitives(network).items()
        if key not in called
        and (prim.attrs.get("in_strategy") is not None or prim.attrs.get("in_layout") is not None)
    }


# The composed attention that the flash kernel replaces on Ascend is built but not run;
# with attention dropout, a training step does not run the evaluation kernel (`attend`).
FLASH_REPLACES = {"qk", "scale", "softmax", "pv", "dropout", "attend"}


def micro_batch_inputs(name: str, real: bool):
    """A logical micro-batch (micro_batch * dp sequences) of tokens and labels."""
    import mindspore as ms

    spec = plan(name).spec
    rows, seq = spec.train.micro_batch * spec.mesh.dp, spec.model.dims["seq"]
    if not real:
        return Shaped((rows, seq)), Shaped((rows, seq))
    ids = np.random.default_rng(0).integers(0, spec.model.dims["vocab"], (rows, seq + 1), np.int32)
    return ms.Tensor(ids[:, :-1]), ms.Tensor(ids[:, 1:])


def stage_devices(name: str) -> int:
    mesh = plan_json(name)["mesh"]
    return mesh["dp"] * mesh["tp"]


def instantiate(name: str, *, lazy: bool, ascend: bool = False, monkeypatch=None):
    """The network of a compiled spec; `ascend`: as built on Ascend (the flash path)."""
    import mindspore as ms
    from mindspore.nn.utils import no_init_parameters

    cls = network_class(load(compiled(name), "model"), plan_json(name))
    if ascend:
        get_context = ms.get_context
        monkeypatch.setattr(
            ms, "get_context", lambda key: "Ascend" if key == "device_target" else get_context(key)
        )
    if lazy:
        with no_init_parameters():
            return cls()
    return cls()


def trace(network, name: str, *, shape_only: bool) -> list[Call]:
    import mindspore as ms

    network.set_train(True)  # dropout runs
    tokens, labels = micro_batch_inputs(name, real=not shape_only)
    if not shape_only:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    with tracing(network, shape_only) as calls:
        network(tokens, labels)
    return calls


@pytest.fixture(scope="module")
def real_traces():
    out = {}
    for name in TINY:
        network = instantiate(name, lazy=False)
        out[name] = (network, trace(network, name, shape_only=False))
    return out


@pytest.mark.parametrize("name", TINY)
def test_tiny_strategies_fit_the_inputs(real_traces, name):
    network, calls = real_traces[name]
    assert calls
    assert strategy_problems(calls, stage_devices(name)) == []
    assert unexercised(network, calls) == set()


@pytest.mark.parametrize("name", TINY)
def test_the_shape_only_trace_sees_what_the_real_run_sees(real_traces, name):
    _, real = real_traces[name]
    network = instantiate(name, lazy=True)
    shaped = trace(network, name, shape_only=True)
    assert [(c.path, c.shapes) for c in shaped] == [(c.path, c.shapes) for c in real]


@pytest.mark.parametrize("name", (*BIG, "tiny_mixed"))
def test_strategies_fit_the_inputs_on_ascend(monkeypatch, name):
    """The big specs, and tiny_mixed, as on Ascend (llama13b and tiny_mixed take the
    flash-attention path), by the shape-only trace."""
    network = instantiate(name, lazy=True, ascend=True, monkeypatch=monkeypatch)
    calls = trace(network, name, shape_only=True)
    assert strategy_problems(calls, stage_devices(name)) == []
    flash = any(type(c.prim).__name__ == "FlashAttentionScore" for c in calls)
    assert flash == (name != "gpt7b")
    left = unexercised(network, calls)
    owners = {path: owner for path, owner, _ in primitives(network).values()}
    assert all(
        flash and owners[p] == "Attention" and p.rsplit(".", 1)[1] in FLASH_REPLACES for p in left
    ), sorted(left)[:10]
    (layer,) = plan_json(name)["layers"].values()
    assert sum(c.path.endswith(".qkv.matmul") for c in calls) == layer["count"]


def test_the_strategy_check_catches_broken_strategies():
    """Each deliberately broken strategy on tiny (dp = tp = pp = 2) is reported."""
    network = instantiate("tiny", lazy=True)
    layer = network.decoder
    broken = {
        # one strategy for MatMul's two inputs
        "decoder.0.qkv.matmul": (layer[0].qkv.matmul, ((2, 1),)),
        # a rank-3 strategy for a rank-2 input
        "decoder.0.proj.matmul": (layer[0].proj.matmul, ((2, 2, 1), (2, 1))),
        # 3 does not divide hidden = 64 (nor the 4 devices of a stage)
        "norm.norm": (network.norm.norm, ((2, 1, 3), (1,), (1,))),
        # the contracted dim split 2 ways on x, whole on the weight
        "decoder.1.up.matmul": (layer[1].up.matmul, ((2, 2), (1, 2))),
        # a scalar operand without its `()`
        "decoder.1.att.scale": (layer[1].att.scale, (((2, 2, 1, 1)),)),
        # operands of an Add split differently
        "decoder.0.h": (layer[0].h, ((2, 1, 1), (1, 1, 2))),
    }
    for prim, strategy in broken.values():
        prim.shard(strategy)
    calls = trace(network, "tiny", shape_only=True)
    problems = strategy_problems(calls, stage_devices("tiny"))
    reported = {p.split(" ", 1)[0] for p in problems}
    assert reported == set(broken), problems

    # tiny_llama: rope's halves are slices of head_dim, which must stay whole
    network = instantiate("tiny_llama", lazy=True)
    network.decoder[0].att.half.shard(((2, 2, 1, 2),))
    problems = strategy_problems(trace(network, "tiny_llama", shape_only=True), 4)
    assert problems and all(p.startswith("decoder.0.att.half ") for p in problems), problems
    assert any("sliced" in p for p in problems)
