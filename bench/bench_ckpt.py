"""Peak host memory of `msgen ckpt from-hf` against its target: one rank's slices plus
one tensor.

    python bench/bench_ckpt.py [-n 5] [--hidden 768] [--layers 8]

Builds a LLaMA-shaped Hugging Face folder (fp32, sharded safetensors with its index,
random weights) and its spec (`msgen import hf`), then runs `ckpt from-hf` in fresh
processes, the kinds interleaved (sliced, whole, sliced, ...):

- sliced: the spec's mesh set to tp 2 x pp 2, so from-hf writes 4 ranks' slices, rank
  by rank; target: the largest rank's slices plus the largest tensor from-hf converts
  (a fused qkv counts its three sources and the fused copy);
- whole: one device, the whole checkpoint at once; for comparison with the model's size;
- fixed: sliced on a model of 256 x 2 layers and a 256-token vocabulary, whose tensors
  are negligible: what the command costs besides the data (the spec analysed, the
  strategy files rendered, MindSpore's save path), subtracted from the two above.

Memory is the peak resident set above the process's own after its imports (the child
imports MindSpore and msgen, then resets the kernel's high-water mark through
/proc/self/clear_refs and reads VmHWM at the end). Prints the median and spread
(min..max) of each kind and the sliced run's ratio to its target (at most TARGET), and
each kind's wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
TARGET = 1.5
MESH = ("--set", "mesh.dp=1", "--set", "mesh.tp=2", "--set", "mesh.pp=2")

CHILD = r"""
import sys
import time
from pathlib import Path
sys.path.insert(0, {repo!r})
import mindspore  # noqa: F401  (from-hf imports it; kept out of the numbers)
from msgen.cli import main

def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

base = status("VmRSS")
Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts here
start = time.perf_counter()
code = main({args!r})
assert code == 0, code
print(status("VmHWM") - base, time.perf_counter() - start)
"""


def hf_folder(folder: Path, hidden: int, layers: int, vocab: int = 16000) -> dict:
    """A LLaMA folder of random fp32 weights in 4 safetensors shards; returns its config."""
    from msgen.hf.tensors import encode

    heads, kv, ffn = hidden // 64, 4, hidden * 8 // 3 // 64 * 64
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}  # fmt: skip
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (heads * 64, hidden),
            p + "self_attn.k_proj.weight": (kv * 64, hidden),
            p + "self_attn.v_proj.weight": (kv * 64, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * 64),
            p + "mlp.gate_proj.weight": (ffn, hidden),
            p + "mlp.up_proj.weight": (ffn, hidden),
            p + "mlp.down_proj.weight": (hidden, ffn),
        }
    names = sorted(shapes)
    weight_map = {}
    for n, part in enumerate(np.array_split(names, 4)):
        file = f"model-{n + 1:05d}-of-00004.safetensors"
        tensors = {str(k): (rng.standard_normal(shapes[k], np.float32), "F32") for k in part}
        with open(folder / file, "wb") as f:
            f.writelines(encode(tensors, {"format": "pt"}))
        weight_map |= {str(k): file for k in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return config


def targets(spec: Path, work: Path, mesh: tuple[str, ...]) -> tuple[int, int, int]:
    """(largest rank's slices, largest converted tensor, whole model) in bytes."""
    from msgen.ckpt.expected import spec_params, stage_layouts
    from msgen.ckpt.slices import slice_shape
    from msgen.compiler import analyze

    result = analyze(spec, [mesh[i + 1] for i in range(0, len(mesh), 2)])
    params = spec_params(result)
    ranks = [
        sum(4 * int(np.prod(slice_shape(params[n], lay))) for n, lay in s.layouts.items() if n in params)
        for s in stage_layouts(result, spec)
    ]  # fmt: skip
    largest = max(4 * int(np.prod(s)) for s in params.values())
    qkv = max(4 * int(np.prod(s)) for n, s in params.items() if n.endswith("qkv.weight"))
    return max(ranks), max(largest, 2 * qkv), sum(4 * int(np.prod(s)) for s in params.values())


def run(args: list[str]) -> tuple[int, float]:
    """(peak bytes above the imports, seconds) of one command in a fresh process."""
    code = CHILD.format(repo=str(REPO), args=args)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"msgen {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    peak, seconds = done.stdout.strip().splitlines()[-1].split()
    return int(peak), float(seconds)


def spread(values: list[float], unit: str) -> str:
    return f"{statistics.median(values):8.1f} {unit} ({min(values):.1f}..{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="runs of each kind (default 5)")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ckpt-") as tmp:
        work = Path(tmp)
        hf_folder(work / "hf", options.hidden, options.layers)
        hf_folder(work / "small", 256, 2, vocab=256)
        spec, small = work / "m.msl", work / "small.msl"
        for folder, out in ((work / "hf", spec), (work / "small", small)):
            subprocess.run([sys.executable, "-m", "msgen.cli", "import", "hf", str(folder / "config.json"),
                            "-o", str(out), "--seq", "512", "--devices", "4", "--per-node", "4"],
                           cwd=REPO, check=True, capture_output=True)  # fmt: skip
        rank, tensor, whole = targets(spec, work, MESH)
        kinds = {
            "sliced": ["ckpt", "from-hf", str(spec), str(work / "hf"), "-o", "OUT", *MESH],
            "whole": ["ckpt", "from-hf", str(spec), str(work / "hf"), "-o", "OUT"],
            "fixed": ["ckpt", "from-hf", str(small), str(work / "small"), "-o", "OUT", *MESH],
        }
        peaks: dict[str, list[float]] = {k: [] for k in kinds}
        seconds: dict[str, list[float]] = {k: [] for k in kinds}
        for i in range(options.n):
            for kind, argv in kinds.items():
                peak, took = run([str(work / f"{kind}{i}") if a == "OUT" else a for a in argv])
                peaks[kind].append(peak / 2**20)
                seconds[kind].append(took)
        mib = 2**20
        print(f"model {whole / mib:.1f} MiB fp32; largest rank's slices {rank / mib:.1f} MiB; "
              f"largest tensor converted {tensor / mib:.1f} MiB")  # fmt: skip
        for kind, values in peaks.items():
            print(f"{kind:7s} peak above imports {spread(values, 'MiB')}, "
                  f"time {spread(seconds[kind], 's')}")  # fmt: skip
        fixed = statistics.median(peaks["fixed"]) * mib
        ratio = (statistics.median(peaks["sliced"]) * mib - fixed) / (rank + tensor)
        verdict = "within" if ratio <= TARGET else "ABOVE"
        print(
            f"(sliced - fixed) / (rank's slices + one tensor) = {ratio:.2f}, {verdict} target {TARGET}"
        )
        print(
            f"(whole - fixed) / model = {(statistics.median(peaks['whole']) * mib - fixed) / whole:.2f}"
        )


if __name__ == "__main__":
    main()
