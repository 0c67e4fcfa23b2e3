"""Speed and memory of `msgen data` against the tokenizer alone.

    python bench/bench_data.py [--sizes 10,200] [-n 3] [--spec specs/gpt7b.msl]

For each corpus size (MB of JSON Lines, built by repeating CPython's help topics, each
copy a distinct document), trains one byte-level BPE on the topics, then runs in a
fresh process: the whole `msgen data` pipeline (read, normalise, hash, tokenize, pack,
write MindRecord), and the tokenizer's own `encode_batch` over the same texts, already
in memory, in the same 1 MB batches. Prints the median MB/s of each, their ratio (the
target: the pipeline costs at most 1.3x the tokenization alone) and the pipeline's
peak memory above the process's memory after its imports (the target: flat in the
corpus size, bounded by the batch and MindRecord's page, not the corpus).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Runs in the child: imports first (not timed, not counted), then one measurement.
CHILD = r"""
import json, resource, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
import mindspore.mindrecord  # noqa: F401  (the pipeline imports it; keep it out of the numbers)
from tokenizers import Tokenizer
from msgen.cli import main
from msgen.data.command import BATCH_BYTES

def rss_kib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

corpus, tokenizer, spec, out, what = sys.argv[1:6]
size = Path(corpus).stat().st_size
base = rss_kib()
if what == "pipeline":
    start = time.perf_counter()
    status = main(["data", spec, corpus, "--tokenizer", tokenizer, "-o", out, "--force"])
    seconds = time.perf_counter() - start
    assert status == 0, status
else:
    texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
    tok = Tokenizer.from_file(tokenizer)
    batches, batch, nbytes = [], [], 0
    for t in texts:
        batch.append(t)
        nbytes += len(t.encode())
        if nbytes >= BATCH_BYTES:
            batches.append(batch)
            batch, nbytes = [], 0
    batches.append(batch)
    start = time.perf_counter()
    for b in batches:
        tok.encode_batch(b, add_special_tokens=False)
    seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"seconds": seconds, "mb": size / 1e6, "peak_above_base_mib": (peak - base) / 1024}}))
"""


def make_corpus(path: Path, megabytes: int) -> None:
    from pydoc_data.topics import topics

    docs = [topics[name] for name in sorted(topics)]
    target, written, copy = megabytes * 10**6, 0, 0
    with path.open("w", encoding="utf-8") as f:
        while written < target:
            for doc in docs:
                line = json.dumps({"text": f"[{copy}] {doc}"}) + "\n"
                f.write(line)
                written += len(line.encode())
            copy += 1


def train_tokenizer(path: Path, vocab: int) -> None:
    sys.path.insert(0, str(REPO))
    from pydoc_data.topics import topics

    from msgen.data.tokenizer import train

    path.write_text(train(list(topics.values()), vocab).to_str(), encoding="utf-8")


def measure(what: str, corpus: Path, tokenizer: Path, spec: Path, out: Path) -> dict:
    code = CHILD.format(repo=str(REPO))
    proc = subprocess.run(
        [sys.executable, "-c", code, str(corpus), str(tokenizer), str(spec), str(out), what],
        capture_output=True,
        text=True,
        env={"GLOG_v": "3", "PATH": "/usr/bin:/bin"},
    )
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,200", help="corpus sizes in MB")
    parser.add_argument("-n", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--spec", type=Path, default=REPO / "specs" / "gpt7b.msl")
    parser.add_argument("--vocab", type=int, default=50257, help="the BPE's vocab (<= spec)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="msgen-bench-data-") as tmp:
        tmp = Path(tmp)
        tokenizer = tmp / "tokenizer.json"
        train_tokenizer(tokenizer, args.vocab)
        print(f"{'MB':>6} {'pipeline MB/s':>14} {'encode_batch MB/s':>18} {'ratio':>6} "
              f"{'peak MiB above imports':>23}")  # fmt: skip
        for size in (int(s) for s in args.sizes.split(",")):
            corpus = tmp / f"corpus{size}.jsonl"
            make_corpus(corpus, size)
            runs = {
                what: [
                    measure(what, corpus, tokenizer, args.spec, tmp / "out") for _ in range(args.n)
                ]
                for what in ("pipeline", "encode_batch")
            }
            speed = {
                w: statistics.median(r["mb"] / r["seconds"] for r in rs) for w, rs in runs.items()
            }
            peak = max(r["peak_above_base_mib"] for r in runs["pipeline"])
            print(
                f"{size:>6} {speed['pipeline']:>14.2f} {speed['encode_batch']:>18.2f} "
                f"{speed['encode_batch'] / speed['pipeline']:>6.2f} {peak:>23.0f}",
                flush=True,
            )
            corpus.unlink()


if __name__ == "__main__":
    main()
