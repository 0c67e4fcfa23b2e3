"""Speed and memory of `msgen data` against the tokenizer alone, like for like.

    python bench/bench_data.py [--sizes 10,200] [-n 3] [--spec specs/gpt7b.msl] [--shapes]

For each corpus size (MB of JSON Lines, built by repeating CPython's help topics, each
copy a distinct document) a byte-level BPE trained on the topics, then, in fresh
processes with the runs of each kind interleaved (pipeline, tokenizer, pipeline, ...):

- pipeline: the whole `msgen data` (read, normalise, hash, tokenize, pack, write
  MindRecord, commit), as the command runs it;
- tokenizer: `encode_batch_fast` (the call the pipeline makes) over the same
  normalised texts, already in memory, in the same batches;
- stages: the pipeline's other work timed alone on the same corpus (reading and
  parsing, normalising, hashing and counting special-token text, turning encodings
  into the packed stream, writing MindRecord), batch by batch as the pipeline goes,
  holding nothing but the batch: where the time above the tokenizer's goes.

`--engines SIZE` measures the workers instead: `msgen data` on a corpus of SIZE MB
(at least 50) with --unit-size 4M, in fresh processes interleaved, with --workers 1,
--workers N (the machine's cores) and --engine ray on N CPUs; it prints each one's
tokens/s (the run's own summary: from when its workers can take units, their imports
done, to the last unit; Ray's start-up apart, printed too) and its whole command's
wall time, the ratio N workers / 1 worker against its target (at least 1.6 on 2
cores), Ray's time / the workers' time against its target (at most 1.3), and the
load average around the runs.

Prints the median and spread (min..max) of each, the ratio pipeline / tokenizer
against its target (at most 1.3), and the pipeline's peak memory above the process's
memory after its imports (target: flat in the corpus size). `--shapes` adds the
corpora that once drove memory up (one 15 MiB document, 64 documents of 1 MiB, a
`.txt.gz` of one 32 MiB line) and prints their peak memory.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET = 1.3

# Runs in the child: imports first (not timed, not counted), then one measurement.
CHILD = r"""
import hashlib, json, resource, sys, time
from pathlib import Path
sys.path.insert(0, {repo!r})
import mindspore.mindrecord  # noqa: F401  (the pipeline imports it; keep it out of the numbers)
from tokenizers import Tokenizer
from msgen.cli import main
from msgen.data.work import BATCH_BYTES, pieces
from msgen.data.normalize import FORMS, normalize

def rss_kib():
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])

def batches(texts):
    batch, size = [], 0
    for text in texts:
        for piece in pieces(text):
            batch.append(piece)
            size += len(piece)
            if size >= BATCH_BYTES:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch

corpus, tokenizer, spec, out, what = sys.argv[1:6]
size = Path(corpus).stat().st_size
base = rss_kib()
times = {{}}
if what == "pipeline":
    start = time.perf_counter()
    status = main(["data", spec, corpus, "--tokenizer", tokenizer, "-o", out, "--force"])
    times["pipeline"] = time.perf_counter() - start
    assert status == 0, status
else:
    from msgen.data.mindrecord import WindowWriter
    from msgen.data.pack import Packer
    from msgen.data.readers import Cursor, read
    from msgen.data.sources import sources
    from msgen.data.tokenizer import SpecialCounter, special_texts
    (source,) = sources([Path(corpus)], "text", False)
    start = time.perf_counter()
    raw = [doc.text for doc in read(source, Cursor())]
    times["read"] = time.perf_counter() - start
    start = time.perf_counter()
    texts = [normalize(t, FORMS["nfkc"])[0] for t in raw]
    times["normalise"] = time.perf_counter() - start
    tok = Tokenizer.from_file(tokenizer)
    tok.encode_special_tokens = True
    counter = SpecialCounter(special_texts(tok))
    start = time.perf_counter()
    for t in texts:
        hashlib.blake2b(t.encode("utf-8"), digest_size=16).digest()
        counter.count(t)
    times["hash"] = time.perf_counter() - start
    work = list(batches(texts))
    del raw, texts
    # batch by batch as the pipeline goes, nothing held but the batch: the tokenizer
    # is timed on its own, then what the pipeline does with its output
    packer = Packer(int(sys.argv[6]) + 1)
    writer = WindowWriter(Path(out + ".stage.mindrecord"), Path(out))
    for stage in ("tokenizer", "pack", "write"):
        times[stage] = 0.0
    for batch in work:
        start = time.perf_counter()
        encodings = tok.encode_batch_fast(batch, add_special_tokens=False)
        times["tokenizer"] += time.perf_counter() - start
        start = time.perf_counter()
        stream = []
        for e in encodings:
            stream += e.ids
            stream.append(0)
        windows = packer.add(stream)
        times["pack"] += time.perf_counter() - start
        start = time.perf_counter()
        writer.write(windows)
        times["write"] += time.perf_counter() - start
    start = time.perf_counter()
    writer.commit()
    times["write"] += time.perf_counter() - start
    for p in Path(out).parent.glob(Path(out).name + ".stage.mindrecord*"):
        p.unlink()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"times": times, "mb": size / 1e6, "peak_above_base_mib": (peak - base) / 1024}}))
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


def make_shapes(folder: Path) -> dict[str, Path]:
    """The corpora of one long document each kind: what once held a whole document
    (and its encoding) in memory."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in sorted(topics))

    def of(n: int, offset: int = 0) -> str:
        return (text * (n // len(text) + 2))[offset : offset + n]

    shapes = {
        "one 15 MiB document (a JSON line within the 16 MiB a record may have)": folder
        / "doc15.jsonl",
        "64 documents of 1 MiB": folder / "doc1x64.jsonl",
        "a .txt.gz of one 32 MiB line": folder / "line32.txt.gz",
    }
    paths = iter(shapes.values())
    next(paths).write_text(json.dumps({"text": of(15 << 20)}) + "\n", encoding="utf-8")
    with next(paths).open("w", encoding="utf-8") as f:
        for i in range(64):
            f.write(json.dumps({"text": f"[{i}] " + of(1 << 20, i * 997)}) + "\n")
    with gzip.open(next(paths), "wt", encoding="utf-8") as f:
        f.write(of(32 << 20).replace("\n", " "))
    return shapes


def train_tokenizer(path: Path, vocab: int) -> None:
    sys.path.insert(0, str(REPO))
    from pydoc_data.topics import topics

    from msgen.data.tokenizer import train

    path.write_text(train(list(topics.values()), vocab).to_str(), encoding="utf-8")


def measure(what: str, corpus: Path, tokenizer: Path, spec: Path, out: Path, seq: int) -> dict:
    code = CHILD.format(repo=str(REPO))
    args = [str(corpus), str(tokenizer), str(spec), str(out), what, str(seq)]
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env={"GLOG_v": "3", "PATH": "/usr/bin:/bin"},
    )
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.2f} ({min(values):.2f}..{max(values):.2f})"


def spec_seq(spec: Path) -> int:
    sys.path.insert(0, str(REPO))
    from msgen.compiler import analyze

    return analyze(spec, []).spec.model.dims["seq"]


SPEEDUP_TARGET = 1.6  # N workers / 1 worker, on 2 cores
RAY_TARGET = 1.3  # Ray's time / the workers' time, at equal cores


def run_engine(flags: list[str], corpus: Path, tokenizer: Path, spec: Path, out: Path) -> dict:
    """One `msgen data` in a fresh process: its run's tokens/s (the summary's), the whole
    command's wall time (s), Ray's start-up and the part of it Ray itself took (s),
    and the load average before and after."""
    import re
    import time

    args = ["data", str(spec), str(corpus), "--tokenizer", str(tokenizer), "-o", str(out),
            "--force", "--unit-size", "4M", *flags]  # fmt: skip
    load = os.getloadavg()[0]
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "msgen.cli", *args], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, "GLOG_v": "3",
                                                    "PYTHONPATH": str(REPO)})  # fmt: skip
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"msgen data {' '.join(flags)} failed:\n{proc.stderr[-3000:]}")
    rate = re.search(r"([\d.,]+) M tokens/s", proc.stderr)
    startup = re.search(r"Ray's start-up: ([\d.,]+) s \(Ray ([\d.,]+) s", proc.stderr)
    number = lambda text: float(text.replace(",", ""))  # noqa: E731
    return {"rate": number(rate[1]), "wall": wall,
            "startup": number(startup[1]) if startup else 0.0,
            "ray": number(startup[2]) if startup else 0.0,
            "load": (load, os.getloadavg()[0])}  # fmt: skip


def engines(size: int, n: int, tokenizer: Path, spec: Path, tmp: Path) -> None:
    """Like for like: each run's time (its summary's) starts once msgen's imports are
    done and its workers can take units (forked ones inherit the imports; Ray's
    workers import at start-up, which is printed apart) and ends with the last unit;
    the whole command's wall time, start-up and all, is printed beside it."""
    cores = len(os.sched_getaffinity(0))
    corpus = tmp / f"engines{size}.jsonl"
    make_corpus(corpus, size)
    kinds = {
        "1 worker": ["--workers", "1"],
        f"{cores} workers": ["--workers", str(cores)],
        f"Ray, {cores} CPUs": ["--engine", "ray", "--workers", str(cores)],
    }
    runs = {kind: [] for kind in kinds}
    for _ in range(n):  # interleaved: a slow spell of the machine hits every kind
        for kind, flags in kinds.items():
            runs[kind].append(run_engine(flags, corpus, tokenizer, spec, tmp / "out"))
    loads = [x for values in runs.values() for r in values for x in r["load"]]
    print(
        f"{size} MB of JSON Lines in units of 4 MiB, {n} runs each, median (min..max); "
        f"load average (1 min) {min(loads):.1f} to {max(loads):.1f} around the runs"
    )
    rates = {kind: [r["rate"] for r in values] for kind, values in runs.items()}
    walls = {kind: [r["wall"] for r in values] for kind, values in runs.items()}
    print(f"  {'':<14} {'M tokens/s (run)':<24} whole command (s)")
    for kind in kinds:
        print(f"  {kind:<14} {spread(rates[kind]):<24} {spread(walls[kind])}")
    one, many, ray = rates.values()
    speedup = [m / o for m, o in zip(many, one)]
    slower = [m / r for m, r in zip(many, ray)]  # Ray's time / the workers' time
    median = statistics.median(speedup)
    verdict = "meets" if median >= SPEEDUP_TARGET else "misses"
    print(f"  {cores} workers / 1 worker: {spread(speedup).strip()}; target >= {SPEEDUP_TARGET}: "
          f"{verdict} ({median / SPEEDUP_TARGET:.2f}x the target)")  # fmt: skip
    median = statistics.median(slower)
    verdict = "meets" if median <= RAY_TARGET else "misses"
    print(f"  Ray / {cores} workers (run time): {spread(slower).strip()}; target <= {RAY_TARGET}: "
          f"{verdict} ({median / RAY_TARGET:.2f}x the target)")  # fmt: skip
    ray_kind, many_kind = f"Ray, {cores} CPUs", f"{cores} workers"
    whole = [r / m for r, m in zip(walls[ray_kind], walls[many_kind])]
    print(f"  Ray / {cores} workers (whole command, start-up included): {spread(whole).strip()}")
    startup = [r["startup"] for r in runs[ray_kind]]
    own = [r["ray"] for r in runs[ray_kind]]
    print(f"  Ray's start-up, apart: {spread(startup).strip()} s, of which Ray itself {spread(own).strip()} s "
          "(the rest: its workers' imports)", flush=True)  # fmt: skip
    corpus.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,200", help="corpus sizes in MB ('' for none)")
    parser.add_argument("-n", type=int, default=3, help="runs of each kind (median)")
    parser.add_argument("--spec", type=Path, default=REPO / "specs" / "gpt7b.msl")
    parser.add_argument("--vocab", type=int, default=50257, help="the BPE's vocab (<= spec)")
    parser.add_argument("--shapes", action="store_true", help="also the long-document corpora")
    parser.add_argument("--engines", type=int, metavar="SIZE",
                        help="1 worker, all workers and Ray on a corpus of SIZE MB")  # fmt: skip
    args = parser.parse_args()
    seq = spec_seq(args.spec)
    with tempfile.TemporaryDirectory(prefix="msgen-bench-data-") as tmp:
        tmp = Path(tmp)
        tokenizer = tmp / "tokenizer.json"
        train_tokenizer(tokenizer, args.vocab)
        if args.engines:
            engines(args.engines, args.n, tokenizer, args.spec, tmp)
        for size in (int(s) for s in args.sizes.split(",") if s):
            corpus = tmp / f"corpus{size}.jsonl"
            make_corpus(corpus, size)
            runs = {"pipeline": [], "stages": []}
            for _ in range(args.n):  # interleaved: a slow spell of the machine hits both
                for what in runs:
                    runs[what].append(measure(what, corpus, tokenizer, args.spec, tmp / "out", seq))
            seconds = {"pipeline": [r["times"]["pipeline"] for r in runs["pipeline"]]}
            for stage in runs["stages"][0]["times"]:
                seconds[stage] = [r["times"][stage] for r in runs["stages"]]
            ratios = [p / t for p, t in zip(seconds["pipeline"], seconds["tokenizer"])]
            print(f"{size} MB of JSON Lines, {args.n} runs each, seconds: median (min..max)")
            for name, values in seconds.items():
                share = statistics.median(values) / statistics.median(seconds["tokenizer"])
                print(f"  {name:<10} {spread(values)}   {share:5.2f}x the tokenizer")
            ratio = statistics.median(ratios)
            verdict = "meets" if ratio <= TARGET else "misses"
            print(
                f"  pipeline / tokenizer: {spread(ratios)}; target <= {TARGET}: {verdict} "
                f"({ratio / TARGET:.2f}x the target)"
            )
            peaks = [r["peak_above_base_mib"] for r in runs["pipeline"]]
            print(f"  pipeline peak memory above imports: {spread(peaks)} MiB", flush=True)
            corpus.unlink()
        if args.shapes:
            for label, path in make_shapes(tmp).items():
                peak = measure("pipeline", path, tokenizer, args.spec, tmp / "out", seq)
                print(f"{label}: peak memory above imports {peak['peak_above_base_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
