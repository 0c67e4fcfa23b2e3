"""The valid files the file fuzzer (tests/file_mutations.py) mutates, one folder per
surface, each holding everything its commands read, made by msgen itself where msgen
makes them:

- config: the published configs of tests/hf_configs and TINY;
- hf, sharded: TINY's Hugging Face folder (config.json, model.safetensors; or two
  shards and model.safetensors.index.json), its tensors random, written with
  msgen.hf.tensors.encode; with tiny.msl and tiny_tp.msl (`import hf`, then tp = 2);
- init: `ckpt from-hf` of tiny.msl (model.ckpt, source.json);
- ranks: `ckpt from-hf` of tiny_tp.msl (rank_<r>/model.ckpt and strategy.json);
- run: a two-rank run of tiny2.msl as train.py leaves it (rank_<r>/log.csv and
  run.json, naming the spec), and a calibration file of the ascend910b.

A folder is made the first time a case asks for it (init and ranks import MindSpore).
"""

from __future__ import annotations

import contextlib
import csv
import json
import shutil
from pathlib import Path

import numpy as np

from msgen.hf.config import model_of
from msgen.hf.layout import hf_names
from msgen.hf.tensors import encode
from tests.mutations import ROOT, call

TINY = {"model_type": "llama", "hidden_act": "silu", "hidden_size": 16, "intermediate_size": 24,
        "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "vocab_size": 32, "rms_norm_eps": 1e-6, "max_position_embeddings": 16,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32"}  # fmt: skip
# train.py's LOG_FIELDS (templates/train/log.py.j2)
LOG_FIELDS = ["step", "loss", "perplexity", "lr", "grad_norm", "loss_scale", "skipped",
              "tokens_per_s", "step_time", "mfu", "valid_loss", "valid_perplexity",
              "peak_memory_bytes"]  # fmt: skip
STEPS = 40
CALIBRATION = {"format": "msgen-calibration 1", "device": "ascend910b",
               "values": {"matmul_efficiency": 0.5, "memory_efficiency": 0.6},
               "runs": [{"run": "run", "spec": "tiny2.msl", "measured_step_s": 0.128,
                         "predicted_step_s": 0.13, "error": 0.015}]}  # fmt: skip


def hf_shape(name: str, c: dict) -> tuple[int, ...]:
    """A tensor's shape as transformers' LLaMA modules declare it (modeling_llama.py:
    embed_tokens and lm_head [vocab, hidden]; q_proj [heads * head_dim, hidden]; k_proj,
    v_proj [kv_heads * head_dim, hidden]; o_proj [hidden, heads * head_dim]; gate_proj,
    up_proj [ffn, hidden]; down_proj [hidden, ffn]; the norms [hidden])."""
    h, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    hd = h // c["num_attention_heads"]
    for part, shape in (("embed", (v, h)), ("lm_head", (v, h)), ("norm", (h,)),
                        ("q_proj", (c["num_attention_heads"] * hd, h)),
                        ("k_proj", (c["num_key_value_heads"] * hd, h)),
                        ("v_proj", (c["num_key_value_heads"] * hd, h)),
                        ("o_proj", (h, c["num_attention_heads"] * hd)), ("gate_proj", (f, h)),
                        ("up_proj", (f, h)), ("down_proj", (h, f))):  # fmt: skip
        if part in name:
            return shape
    raise KeyError(name)


def msgen_in(folder: Path, *argv: str) -> None:
    with contextlib.chdir(folder):
        status, err = call(list(argv))
    assert status == 0, f"making the seeds: msgen {' '.join(argv)}: {err}"


class Seeds:
    """The seed folders under `root`, each made on first use."""

    def __init__(self, root: Path):
        self.root = root

    def folder(self, surface: str) -> Path:
        path = self.root / surface
        if not path.is_dir():
            staging = self.root / f".{surface}.making"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            getattr(self, f"_make_{surface}")(staging)
            staging.rename(path)
        return path

    def _make_config(self, out: Path) -> None:
        for path in sorted((ROOT / "tests" / "hf_configs").glob("*.json")):
            shutil.copyfile(path, out / path.name)
        (out / "tiny.json").write_text(json.dumps(TINY, indent=2))

    def _specs(self, out: Path) -> None:
        """tiny.msl (one device), tiny2.msl (dp = 2) and tiny_tp.msl (tp = 2)."""
        (out / "hf").mkdir()
        (out / "hf" / "config.json").write_text(json.dumps(TINY, indent=2))
        base = ("import", "hf", "hf/config.json", "--seq", "16", "--global-batch", "8", "--name")
        base += ("tiny",)
        msgen_in(out, *base, "-o", "tiny.msl")
        msgen_in(out, *base, "-o", "tiny2.msl", "--devices", "2", "--per-node", "2")
        tp = (out / "tiny2.msl").read_text().replace("dp = 2", "dp = 1").replace("tp = 1", "tp = 2")
        (out / "tiny_tp.msl").write_text(tp.replace("micro_batches = 1", "micro_batches = 2"))

    def _tensors(self) -> dict:
        rng = np.random.default_rng(0)
        names = hf_names(model_of(TINY))
        return {
            n: (rng.standard_normal(hf_shape(n, TINY)).astype(np.float32), "F32") for n in names
        }

    def _make_hf(self, out: Path) -> None:
        self._specs(out)
        chunks = encode(self._tensors(), {"format": "pt"})
        (out / "hf" / "model.safetensors").write_bytes(b"".join(chunks))

    def _make_sharded(self, out: Path) -> None:
        self._specs(out)
        tensors = self._tensors()
        names = sorted(tensors)
        shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
                  "model-00002-of-00002.safetensors": names[len(names) // 2 :]}  # fmt: skip
        for file, part in shards.items():
            chunks = encode({n: tensors[n] for n in part}, {"format": "pt"})
            (out / "hf" / file).write_bytes(b"".join(chunks))
        index = {"metadata": {"total_size": sum(a.nbytes for a, _ in tensors.values())},
                 "weight_map": {n: f for f, part in shards.items() for n in part}}  # fmt: skip
        (out / "hf" / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))

    def _make_init(self, out: Path) -> None:
        shutil.copytree(self.folder("hf"), out, dirs_exist_ok=True)
        msgen_in(out, "ckpt", "from-hf", "tiny.msl", "hf", "-o", "init")

    def _make_ranks(self, out: Path) -> None:
        shutil.copytree(self.folder("hf"), out, dirs_exist_ok=True)
        msgen_in(out, "ckpt", "from-hf", "tiny_tp.msl", "hf", "-o", "ranks")

    def _make_run(self, out: Path) -> None:
        for spec in ("tiny.msl", "tiny2.msl"):
            shutil.copyfile(self.folder("hf") / spec, out / spec)
        rng = np.random.default_rng(1)
        for rank in range(2):
            folder = out / "run" / f"rank_{rank}"
            folder.mkdir(parents=True)
            with (folder / "log.csv").open("w", newline="") as f:
                log = csv.writer(f)
                log.writerow(LOG_FIELDS)
                for step in range(1, STEPS + 1):
                    loss = 5 - step / 50 + 0.01 * rng.standard_normal()
                    valid = f"{loss + 0.05:.6g}" if step % 10 == 0 else ""
                    took = 0.128 * (1 + 0.01 * rng.standard_normal())
                    log.writerow([step, f"{loss:.6g}", f"{np.exp(loss):.6g}", "0.001", "1.5",
                                  "65536", "0", f"{8 * 16 / took:.6g}", f"{took:.6g}", "1e-05",
                                  valid, "", 1 << 20])  # fmt: skip
            segment = {"started": "2025-01-01T00:00:00+00:00", "start_step": 0, "rank": rank,
                       "world": 2, "host": "node0", "argv": ["train.py"],
                       "spec": {"name": "tiny", "path": "tiny2.msl", "sha256": None},
                       "manifest_sha256": None, "tokens_per_step": 128,
                       "mesh": {"dp": 2, "tp": 1, "pp": 1},
                       "versions": {"msgen": "0.1.0", "mindspore": "2.1.0", "python": "3.11.0"},
                       "version_files": {}, "env": {"RANK_SIZE": "2"}}  # fmt: skip
            (folder / "run.json").write_text(json.dumps({"segments": [segment]}, indent=2))
        (out / "calibration.json").write_text(json.dumps(CALIBRATION, indent=2))
