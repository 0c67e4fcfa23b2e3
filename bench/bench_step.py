"""Step time of the generated tiny model against a hand-written MindSpore model of the
same architecture, stand-alone on this machine's device (the CPU here), and of the
generated train.py's own step.

    python bench/bench_step.py [-r 5] [-k 10] [--spec specs/tiny.msl]

Both models are the GPT layer of specs/tiny.msl (layernorm, fused qkv, causal attention,
projection, dropout, residual, layernorm, exact-GELU MLP, dropout, residual), learned
positions, the output layer tied to the embedding, full recompute of each layer, mean
next-token cross entropy; fp32. Both train with the same AdamWeightDecay in one
compiled step (nn.TrainOneStepCell), after two untimed warm-up steps (the compile).
The hand-written model is what a MindSpore user writes without msgen: nn.Dense,
nn.LayerNorm, ops.softmax and ops.cross_entropy.

Every row does the same work per step: the spec's step, micro_batch * dp *
micro_batches sequences (train.py --standalone takes them all in one process). The
networks take them as one batch; "generated, micro-batched" takes them as train.py
does, the generated network under MindSpore's Pipeline cell (one graph looping over
micro_batches slices, parallel/nn/parallel_cell_wrapper.py PipelineCell.construct).
"train.py step" is the generated train.py's own step cell, built by its `build()` in
this process (its Pipeline, TrainStep with gradient scaling, finiteness test, global
norm and clipping, its AdamW and warm-up cosine schedule), on the same batch; "train.py
run" is the script itself (`--standalone --synthetic`), its step times as its log.csv
records them (wall time only), the first two (the compile) left out. The rows in
between say where train.py's time goes: the micro-batch loop, then the step's own work.

R rounds, each K steps of every step in this process and one run of train.py with
K + 2 steps, in turn (interleaved: a slow moment of a shared machine falls on all of
them). Prints each one's median step (wall), the spread of its round medians (max -
min), and its median CPU time (the process's, all threads: less sensitive than wall
time to other processes on a loaded machine), and the ratios to the hand-written model
(target: at most 1.1).
"""

from __future__ import annotations

import argparse
import atexit
import csv
import importlib.util
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def generated_network(spec: Path):
    """The generated model's network class, and its folder."""
    sys.path.insert(0, str(REPO))
    from msgen.checks.reserved import camel
    from msgen.cli import main

    out = Path(tempfile.mkdtemp(prefix="msgen-bench-"))
    atexit.register(shutil.rmtree, out, ignore_errors=True)
    assert main(["compile", str(spec), "-o", str(out)]) == 0
    (folder,) = [p for p in out.iterdir() if p.is_dir()]
    module_spec = importlib.util.spec_from_file_location("bench_model", folder / "model.py")
    model = importlib.util.module_from_spec(module_spec)
    sys.modules["bench_model"] = model  # MindSpore's parser imports a cell's module by name
    module_spec.loader.exec_module(model)
    return getattr(model, camel(folder.name)), folder


def hand_written(vocab, hidden, heads, ffn, layers, seq):
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn, ops
    from mindspore.common.initializer import Normal, initializer

    class Block(nn.Cell):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm((hidden,), epsilon=1e-5)
            self.qkv = nn.Dense(hidden, 3 * hidden)
            self.proj = nn.Dense(hidden, hidden)
            self.ln2 = nn.LayerNorm((hidden,), epsilon=1e-5)
            self.up = nn.Dense(hidden, ffn)
            self.down = nn.Dense(ffn, hidden)
            self.drop = nn.Dropout(p=0.1)
            self.mask = Tensor(np.triu(np.full((seq, seq), -1e9, np.float32), 1))

        def construct(self, x):
            b, s, h = x.shape
            d = h // heads
            qkv = self.qkv(self.ln1(x)).reshape(b, s, heads, 3, d).transpose(3, 0, 2, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            scores = ops.matmul(q, k.swapaxes(-1, -2)) / math.sqrt(d) + self.mask
            att = ops.matmul(ops.softmax(scores, -1), v).transpose(0, 2, 1, 3).reshape(b, s, h)
            x = x + self.drop(self.proj(att))
            return x + self.drop(self.down(ops.gelu(self.up(self.ln2(x)), approximate="none")))

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.table = Parameter(initializer(Normal(0.02), (vocab, hidden)))
            self.pos = Parameter(initializer(Normal(0.02), (seq, hidden)))
            self.blocks = nn.CellList([Block() for _ in range(layers)])
            for block in self.blocks:
                block.recompute()
            self.norm = nn.LayerNorm((hidden,), epsilon=1e-5)

        def construct(self, tokens, labels):
            x = ops.gather(self.table, tokens, 0) + self.pos
            for block in self.blocks:
                x = block(x)
            logits = ops.matmul(self.norm(x), self.table.T)
            return ops.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))

    del ms
    return Net()


def compiled_step(network, tokens, labels, micro_batches: int = 1):
    """A compiled train step of `network` and its batch, MindSpore's own
    nn.TrainOneStepCell (forward, gradients, the optimizer, in one graph, a Cell as
    train.py's TrainStep is: an @ms.jit function around value_and_grad took about twice
    the CPU time per step here); two warm-up steps done. With micro_batches > 1 the
    network runs under the Pipeline cell, as train.py's does."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.parallel.nn import Pipeline

    if micro_batches > 1:
        network = Pipeline(network, micro_batches)
    optimizer = nn.AdamWeightDecay(network.trainable_params(), 1e-3)
    step = nn.TrainOneStepCell(network, optimizer)
    step.set_train(True)
    x, y = ms.Tensor(tokens), ms.Tensor(labels)
    for _ in range(2):
        step(x, y).asnumpy()
    return lambda: step(x, y).asnumpy()


def timed(step, k: int) -> list[tuple[float, float]]:
    """(wall, CPU) seconds of each of k steps."""
    times = []
    for _ in range(k):
        wall, cpu = time.perf_counter(), time.process_time()
        step()
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    return times


def train_py_step(folder: Path, tokens, labels):
    """The generated train.py's step cell, built as its main() builds it stand-alone;
    two warm-up steps done."""
    import mindspore as ms

    sys.path.insert(0, str(folder))  # train.py imports its model.py
    module_spec = importlib.util.spec_from_file_location("bench_train", folder / "train.py")
    train = importlib.util.module_from_spec(module_spec)
    sys.modules["bench_train"] = train
    module_spec.loader.exec_module(train)
    cell = train.build(False, False).step_cell
    x, y = ms.Tensor(tokens), ms.Tensor(labels)
    for _ in range(2):
        cell(x, y)[0].asnumpy()
    return lambda: cell(x, y)[0].asnumpy()


def train_py_steps(folder: Path, k: int) -> list[tuple[float, float]]:
    """One run of the generated train.py: its log.csv's step times but the first two
    (wall time; no CPU time: nan)."""
    with tempfile.TemporaryDirectory() as out:
        argv = [sys.executable, str(folder / "train.py"), "--standalone", "--synthetic",
                "--steps", str(k + 2), "--output", out]  # fmt: skip
        subprocess.run(argv, cwd=folder, check=True, capture_output=True)
        (log,) = Path(out).rglob("log.csv")
        rows = list(csv.DictReader(log.open()))
    return [(float(r["step_time"]), math.nan) for r in rows[2:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-r", "--rounds", type=int, default=5)
    parser.add_argument("-k", "--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--spec", type=Path, default=REPO / "specs" / "tiny.msl")
    args = parser.parse_args()
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    sys.path.insert(0, str(REPO))
    from msgen.compiler import analyze

    spec = analyze(args.spec).spec
    dims = spec.model.dims
    micro_batches = spec.micro_batches
    rows = spec.train.micro_batch * spec.mesh.dp * micro_batches  # train.py's STEP_ROWS
    rng = np.random.default_rng(0)
    ids = rng.integers(0, dims["vocab"], (rows, dims["seq"] + 1), np.int32)
    tokens, labels = ids[:, :-1], ids[:, 1:]
    sizes = (dims["vocab"], dims["hidden"], dims["heads"], dims["ffn"], dims["layers"], dims["seq"])
    network, folder = generated_network(args.spec)
    steps = {
        "generated": compiled_step(network(), tokens, labels),
        "hand-written": compiled_step(hand_written(*sizes), tokens, labels),
        "generated, micro-batched": compiled_step(network(), tokens, labels, micro_batches),
        "train.py step": train_py_step(folder, tokens, labels),
    }
    rounds: dict[str, list[list[tuple[float, float]]]] = {n: [] for n in [*steps, "train.py run"]}
    for _ in range(args.rounds):
        for name, step in steps.items():
            rounds[name].append(timed(step, args.steps))
        rounds["train.py run"].append(train_py_steps(folder, args.steps))
    print(f"{args.rounds} rounds of {args.steps} steps each, interleaved; {rows} sequences "
          f"of {dims['seq']} tokens per step ({micro_batches} micro-batches where "
          "micro-batched)")  # fmt: skip
    wall, cpu = {}, {}
    for name, per_round in rounds.items():
        wall[name] = statistics.median(w for r in per_round for w, _ in r)
        cpu[name] = statistics.median(c for r in per_round for _, c in r)
        of_rounds = [statistics.median(w for w, _ in r) for r in per_round]
        spread = max(of_rounds) - min(of_rounds)
        print(f"{name:>24}: median step {wall[name] * 1e3:8.2f} ms, spread of round medians "
              f"{spread * 1e3:7.2f} ms, median CPU {cpu[name] * 1e3:8.2f} ms")  # fmt: skip
    base = "hand-written"
    for name in ("generated", "generated, micro-batched", "train.py step", "train.py run"):
        print(f"ratio {name} / {base}: wall {wall[name] / wall[base]:.3f}, "
              f"CPU {cpu[name] / cpu[base]:.3f} (target <= 1.1)")  # fmt: skip
    looped = "generated, micro-batched"
    print(f"ratio train.py step / {looped}: wall {wall['train.py step'] / wall[looped]:.3f}, "
          f"CPU {cpu['train.py step'] / cpu[looped]:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
