"""The compiled specs' train.py, run on real MindSpore (CPU): loss falls, resume continues.

One module fixture trains the four tiny specs stand-alone side by side in
subprocesses (tiny, tiny_llama and tiny_interleaved on the synthetic set, tiny_mixed
on a small MindRecord file), then resumes all four from their checkpoints. That takes most
of this module's time: GRAPH_MODE compiles a step in ~12-16 s per process on a
small CPU; a per-folder compile cache lets the resumed runs skip most of theirs.
"""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.emit_fixtures import BIG, TINY, compiled, copy_compiled, load, network_class, plan_json

FIRST_STEPS, RESUMED_STEPS = 40, 50
DATA_ROWS = 16  # tiny_mixed's MindRecord file: few enough sequences to memorise
SYNTHETIC = {"tiny": True, "tiny_llama": True, "tiny_mixed": False, "tiny_interleaved": True}


def write_mindrecord(path: Path, rows: np.ndarray) -> None:
    from mindspore.mindrecord import FileWriter

    writer = FileWriter(str(path), shard_num=1)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "tokens")
    writer.write_raw_data([{"input_ids": r} for r in rows])
    writer.commit()


def log_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def run_all(folders: dict[str, Path], tag: str, *extra: str) -> None:
    """Run train.py in every folder at once (one process each) and wait for all;
    each one's output goes to <folder>/<tag>.out."""
    env = {**os.environ, "MS_COMPILER_CACHE_ENABLE": "1", "GLOG_v": "3"}
    procs = {}
    for name, folder in folders.items():
        env_one = {**env, "MS_COMPILER_CACHE_PATH": str(folder / "cache")}
        data = ["--synthetic"] if SYNTHETIC[name] else []
        cmd = [sys.executable, "train.py", "--standalone", *data, *extra]
        procs[name] = subprocess.Popen(
            cmd,
            cwd=folder,
            env=env_one,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=900)
        (folders[name] / f"{tag}.out").write_text(out)
        assert proc.returncode == 0, f"{name}: train.py {' '.join(extra)} failed:\n{out[-4000:]}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Path]:
    """The tiny specs trained FIRST_STEPS steps, then resumed to RESUMED_STEPS."""
    root = tmp_path_factory.mktemp("trained")
    folders = {name: copy_compiled(name, root / name) for name in TINY}
    train = load(folders["tiny_mixed"], "train")
    rng = np.random.default_rng(7)
    write_mindrecord(
        folders["tiny_mixed"] / "train.mindrecord",
        rng.integers(0, train.VOCAB, (DATA_ROWS, train.SEQ + 1), np.int32),
    )
    run_all(folders, "first", "--steps", str(FIRST_STEPS))
    for folder in folders.values():
        log = folder / "output" / "rank_0" / "log.csv"
        (folder / "first_run_log.csv").write_text(log.read_text())
        # As if the run had gone on past its last checkpoint before dying.
        with log.open("a") as f:
            f.write(f"{FIRST_STEPS + 1},9,9,9,9,9,1,9,9,9,9,9\n")
    run_all(folders, "resumed", "--steps", str(RESUMED_STEPS), "--resume")
    return folders


def schedule_lr(train, step: int) -> float:
    """The learning rate train.py's WarmupCosine gives at optimizer step `step` (from 0)."""
    if step < train.WARMUP:
        return train.LR * (step + 1) / max(train.WARMUP, 1)
    progress = min(max((step - train.WARMUP) / max(train.STEPS - train.WARMUP, 1), 0.0), 1.0)
    return train.MIN_LR + 0.5 * (train.LR - train.MIN_LR) * (1 + math.cos(progress * math.pi))


@pytest.mark.parametrize("name", TINY)
def test_loss_falls(trained, name):
    first = log_rows(trained[name] / "first_run_log.csv")
    assert [int(r["step"]) for r in first] == list(range(1, FIRST_STEPS + 1))
    losses = [float(r["loss"]) for r in first]
    assert abs(losses[0] - np.log(256)) < 0.1  # uniform over the vocabulary at init
    assert np.mean(losses[-3:]) < 0.85 * losses[0], losses
    assert all(np.isfinite(losses))
    final = [float(r["loss"]) for r in log_rows(trained[name] / "output" / "rank_0" / "log.csv")]
    assert np.mean(final[-3:]) < 0.8 * losses[0], final


@pytest.mark.parametrize("name", TINY)
def test_resume_continues_from_the_saved_step(trained, name):
    folder = trained[name]
    train = load(folder, "train")
    assert f"steps {FIRST_STEPS} -> {RESUMED_STEPS}" in (folder / "resumed.out").read_text()
    first = log_rows(folder / "first_run_log.csv")
    rows = log_rows(folder / "output" / "rank_0" / "log.csv")
    assert [int(r["step"]) for r in rows] == list(range(1, RESUMED_STEPS + 1))
    assert rows[:FIRST_STEPS] == first  # the log is cut back to the checkpoint, then goes on
    resumed = [float(r["loss"]) for r in rows[FIRST_STEPS:]]
    # From the trained weights, not from scratch (about log(256) = 5.55 at init) ...
    assert resumed[0] < float(first[-1]["loss"]) + 0.3
    # ... and at the schedule position: the first resumed step runs at step FIRST_STEPS's lr.
    for row in rows:
        assert float(row["lr"]) == pytest.approx(schedule_lr(train, int(row["step"]) - 1), 1e-5)
    scale = getattr(train, "LOSS_SCALE", 1.0)
    assert all(float(r["loss_scale"]) == scale for r in rows)
    assert all(float(r["grad_norm"]) > 0 and float(r["tokens_per_s"]) > 0 for r in rows)
    ckpts = sorted(p.name for p in (folder / "output" / "rank_0").glob("*.ckpt"))
    assert ckpts == [f"step_{FIRST_STEPS:08d}.ckpt", f"step_{RESUMED_STEPS:08d}.ckpt"]


@pytest.mark.parametrize("name", TINY)
def test_restore_loads_what_was_saved(trained, name):
    import mindspore as ms

    folder = trained[name]
    train = load(folder, "train")
    network = network_class(load(folder, "model"), plan_json(name))()
    optimizer = train.AdamW(train.parameter_groups(network), train.WarmupCosine())
    extra = ()
    if hasattr(train, "LOSS_SCALE_WINDOW"):  # dynamic; a fixed scale is no state
        extra = (ms.amp.DynamicLossScaler(train.LOSS_SCALE, 2, train.LOSS_SCALE_WINDOW),)
    state = train.state_parameters(network, optimizer, *extra)
    before = {k: p.asnumpy().copy() for k, p in state.items()}
    checkpoints = folder / "output" / "rank_0"
    step = train.restore(checkpoints, state)
    assert step == RESUMED_STEPS
    saved = ms.load_checkpoint(str(checkpoints / f"step_{RESUMED_STEPS:08d}.ckpt"))
    for key, p in state.items():
        np.testing.assert_array_equal(p.asnumpy(), saved[key].asnumpy(), err_msg=key)
    assert int(optimizer.global_step.asnumpy()[0]) == RESUMED_STEPS  # schedule position
    assert any(key.startswith("adam_m.") for key in state)
    trained_weights = [k for k, p in network.parameters_and_names()]
    assert trained_weights and all(
        not np.array_equal(before[k], state[k].asnumpy()) for k in trained_weights
    )
    if extra:
        assert {"loss_scale.value", "loss_scale.counter"} <= set(state)


def test_a_fixed_loss_scale_scales_the_loss_and_unscales_the_gradients(trained):
    """tiny_interleaved has `loss_scale = 1024`: train.py backpropagates 1024 * loss and
    divides the gradients back, so the logged gradient norm is the unscaled one (about
    1, not about 1000; clipping at 1.0 does not hide it, as the norm is taken before)."""
    folder = trained["tiny_interleaved"]
    train = load(folder, "train")
    assert train.LOSS_SCALE == 1024.0 and not hasattr(train, "LOSS_SCALE_WINDOW")
    source = (folder / "train.py").read_text()
    assert "ops.full_like(loss, LOSS_SCALE)" in source
    assert "1.0 / (LOSS_SCALE * MICRO_BATCHES)" in source
    rows = log_rows(folder / "first_run_log.csv")
    assert all(float(r["loss_scale"]) == 1024.0 for r in rows)
    norms = [float(r["grad_norm"]) for r in rows]
    assert all(0 < n < 20 for n in norms), norms


def test_mindrecord_batches_resume_where_they_left(tmp_path):
    train = load(compiled("tiny_mixed"), "train")
    data = tmp_path / "train.mindrecord"
    rows = np.arange(40 * (train.SEQ + 1), dtype=np.int32).reshape(40, train.SEQ + 1) % train.VOCAB
    write_mindrecord(data, rows)
    train.DATA = str(data)

    def take(shard, start, n):
        batches = train.mindrecord_batches(2, shard, start)
        return [next(batches) for _ in range(n)]

    import mindspore.dataset as ds

    per_step = train.STEP_ROWS // 2
    ds.config.set_seed(train.SEED)
    whole = take(0, 0, 7)  # past one epoch: 20 rows per shard
    ds.config.set_seed(train.SEED)
    later = take(0, 3, 4)
    for (tokens, labels), (t2, l2) in zip(whole[3:], later, strict=True):
        np.testing.assert_array_equal(tokens, t2)
        np.testing.assert_array_equal(labels, l2)
    tokens, labels = whole[0]
    assert tokens.shape == labels.shape == (per_step, train.SEQ)
    np.testing.assert_array_equal(tokens[:, 1:], labels[:, :-1])  # labels are the next tokens
    other = take(1, 0, 5)  # the other data-parallel shard reads other sequences
    assert not {tuple(r) for t, _ in whole[:5] for r in t} & {tuple(r) for t, _ in other for r in t}


def test_generated_code_is_ruff_clean():
    ruff = Path(sys.executable).with_name("ruff")
    folders = [compiled(name) for name in (*TINY, *BIG)]
    result = subprocess.run(
        [
            str(ruff),
            "check",
            "--isolated",
            "--select",
            "E,W,F,I,B",
            "--ignore",
            "E501",
            *map(str, folders),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout


def test_adamw_is_the_published_update():
    """Two steps of train.py's AdamW against numpy, as torch.optim.AdamW computes them
    (decoupled decay, bias-corrected moments), to 1e-6; a parameter in the no-decay group
    is not decayed."""
    import mindspore as ms

    train = load(compiled("tiny"), "train")
    rng = np.random.default_rng(0)
    start = {"w": rng.normal(size=(4, 3)), "b": rng.normal(size=(3,))}
    params = {k: ms.Parameter(ms.Tensor(v, ms.float32), name=k) for k, v in start.items()}
    decay = {"w": train.WEIGHT_DECAY, "b": 0.0}
    lr = 0.01
    optimizer = train.AdamW(
        [
            {"params": [params["w"]], "weight_decay": decay["w"]},
            {"params": [params["b"]], "weight_decay": decay["b"]},
            {"order_params": list(params.values())},
        ],
        lr,
    )
    (b1, b2), eps = train.BETAS, train.ADAM_EPS
    want = {k: v.astype(np.float32).astype(np.float64) for k, v in start.items()}
    m = {k: np.zeros_like(v) for k, v in want.items()}
    v = {k: np.zeros_like(x) for k, x in want.items()}
    for t in (1, 2):
        grads = {k: rng.normal(size=x.shape).astype(np.float32) for k, x in want.items()}
        optimizer(tuple(ms.Tensor(grads[k]) for k in params))
        for k in want:
            g = grads[k].astype(np.float64)
            m[k] = b1 * m[k] + (1 - b1) * g
            v[k] = b2 * v[k] + (1 - b2) * g * g
            m_hat, v_hat = m[k] / (1 - b1**t), v[k] / (1 - b2**t)
            want[k] = want[k] * (1 - lr * decay[k]) - lr * m_hat / (np.sqrt(v_hat) + eps)
            np.testing.assert_allclose(params[k].asnumpy(), want[k], atol=1e-6, err_msg=(k, t))
    # The first step moves every element by about lr (m_hat / sqrt(v_hat) = +-1): what the
    # bias correction gives, and what nn.AdamWeightDecay (without it) does not.
    assert np.all(np.abs(want["b"] - start["b"]) > 0.5 * lr)


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "no such data file (resolved from"),
        ("not_mindrecord", "is not a MindRecord file"),
        ("wrong_column", "has no int32 input_ids column (columns: ['ids'])"),
        ("wrong_seq", "sample 0 has 21 ids; the spec's seq + 1 is 33"),
        ("too_few", "holds 3 samples, fewer than the 8 of one step"),
        (
            "other_spec",
            "made for vocab=512, seq=32; the spec has vocab=256, seq=32 (rerun msgen data)",
        ),
    ],
)
def test_train_py_checks_the_data_before_building(tmp_path, capsys, case, message):
    """train.py's check of a MindRecord: one line on stderr and exit 2 for each misfit."""
    from mindspore.mindrecord import FileWriter

    train = load(compiled("tiny_mixed"), "train")
    path = tmp_path / "train.mindrecord"
    column, length, rows = "input_ids", train.SEQ + 1, train.STEP_ROWS
    if case == "wrong_column":
        column = "ids"
    elif case == "wrong_seq":
        length = 21
    elif case == "too_few":
        rows = 3
    if case == "not_mindrecord":
        path.write_text("just text\n")
    elif case != "missing":
        writer = FileWriter(str(path), shard_num=1)
        writer.add_schema({column: {"type": "int32", "shape": [-1]}}, "tokens")
        writer.write_raw_data([{column: np.arange(length, dtype=np.int32)} for _ in range(rows)])
        writer.commit()
    if case == "other_spec":
        (tmp_path / "dataset.json").write_text('{"vocab": 512, "seq": 32}')
    with pytest.raises(SystemExit) as exit_info:
        train.check_data(str(path))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("train.py: error: ") and message in err, err


def test_train_py_takes_data_made_elsewhere_with_a_notice(tmp_path, capsys):
    train = load(compiled("tiny_mixed"), "train")
    path = tmp_path / "train.mindrecord"
    write_mindrecord(path, np.zeros((train.STEP_ROWS, train.SEQ + 1), np.int32))
    train.check_data(str(path))
    assert "no dataset.json beside it" in capsys.readouterr().out
    (tmp_path / "dataset.json").write_text(f'{{"vocab": {train.VOCAB}, "seq": {train.SEQ}}}')
    train.check_data(str(path))
    assert capsys.readouterr().out == ""
