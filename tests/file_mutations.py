"""The file fuzzer: the second campaign beside the spec fuzzer (tests/mutations.py),
over the files msgen's tools take from outside. A case is a copy of a surface's seed
folder (tests/file_seeds.py) with one file mutated (tests/file_mutators.py), or the
run folder itself damaged, through the command that reads it, in-process with the
spec fuzzer's runner and oracle (tests.mutations.call and failures: in time, an exit
status the README documents, never 70 or a traceback):

| surface     | mutated                                  | commands                      |
|-------------|------------------------------------------|-------------------------------|
| config      | config.json (published configs, TINY)    | import hf                     |
| hf-config   | the Hugging Face folder's config.json    | ckpt from-hf                  |
| safetensors | model.safetensors (header and bytes)     | ckpt from-hf                  |
| index       | model.safetensors.index.json, a shard    | ckpt from-hf                  |
| source      | from-hf's source.json                    | ckpt to-hf                    |
| ranks       | a rank's strategy.json, the rank folders | ckpt merge, ckpt reshard      |
| run.json    | a rank's run.json, the rank folders      | report, calibrate             |
| log.csv     | a rank's log.csv                         | report, calibrate             |
| calibration | a calibration file                       | report, estimate --calibration|

Case `i` of campaign `seed` is the same on every run (its own random.Random), so a
failure is reproduced by its numbers: `bench/bench_fuzz.py --files --seed S --case I`.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.file_mutators import mutate_bytes, mutate_csv, mutate_json, mutate_safetensors
from tests.file_seeds import Seeds
from tests.mutations import call, failures

# surface -> weight in a campaign: each surface gets at least several hundred cases in
# 5,000; the ckpt surfaces (MindSpore's transform) cost more per case
WEIGHTS = {"config": 3, "hf-config": 1, "safetensors": 3, "index": 2, "source": 1, "ranks": 2,
           "run.json": 2, "log.csv": 3, "calibration": 1}  # fmt: skip
SURFACES = tuple(WEIGHTS)
SEED_OF = {"config": "config", "hf-config": "hf", "safetensors": "hf", "index": "sharded",
           "source": "init", "ranks": "ranks", "run.json": "run", "log.csv": "run",
           "calibration": "run"}  # fmt: skip
REPORTS = [["report", "run"], ["report", "run", "--json"], ["report", "run", "--svg", "o.svg"],
           ["report", "run", "--html", "o.html"], ["report", "run", "--spec", "tiny2.msl"],
           ["calibrate", "run", "--fit", "matmul_efficiency"],
           ["calibrate", "run", "--spec", "tiny2.msl", "--fit", "matmul_efficiency", "-o",
            "c.json"]]  # fmt: skip
RESHARD = ["ckpt", "reshard", "tiny_tp.msl", "ranks", "--set", "mesh.tp=1", "--set", "mesh.dp=2",
           "-o", "resharded"]  # fmt: skip
MUTATOR = {".json": mutate_json, ".csv": mutate_csv, ".safetensors": mutate_safetensors}


@dataclass(frozen=True)
class Case:
    seed: int
    index: int
    surface: str
    target: str  # the file or folder mutated
    edit: str  # what was done to it
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return (f"case {self.index} (seed {self.seed}) {self.surface}: {self.target}: "
                f"{self.edit[:200]!r}; msgen {' '.join(self.argv)}")  # fmt: skip


def mutate_file(path: Path, rnd: random.Random) -> str:
    data, edit = MUTATOR.get(path.suffix, mutate_bytes)(path.read_bytes(), rnd)
    path.write_bytes(data)
    return edit


def damage_folder(run: Path, rnd: random.Random) -> tuple[str, str]:
    """A run folder as a crash, a mistake or a hostile user leaves it: (what, how)."""
    ranks = sorted(p for p in run.iterdir() if p.is_dir())
    rank = rnd.choice(ranks)
    files = sorted(p for p in rank.iterdir() if p.is_file())
    kind = rnd.choice(("rename", "add", "remove", "special", "step", "cut"))
    if kind == "rename":
        name = rnd.choice(["rank_100000000", "rank_7", "rank_01", "rank_-1", "rank_1 ",
                           "rank_\x1b[2J", "rank_" + "9" * 200, "rank_٣"])  # fmt: skip
        rank.rename(run / name)
        return rank.name, f"renamed {name!r}"
    if kind == "add":
        name = rnd.choice(["rank_2", "rank_5", "rank_100000000"])
        shutil.copytree(rank, run / name) if rnd.random() < 0.5 else (run / name).mkdir()
        return name, "added"
    file = rnd.choice(files)
    if kind == "remove":
        file.unlink()
        return f"{rank.name}/{file.name}", "removed"
    if kind == "special":
        file.unlink()
        how = rnd.choice(("fifo", "folder", "zero", "outside", "loop", "empty"))
        if how == "fifo":
            os.mkfifo(file)
        elif how == "folder":
            file.mkdir()
        elif how == "empty":
            file.write_bytes(b"")
        else:
            target = {"zero": "/dev/zero", "outside": "../../outside.txt", "loop": file.name}
            file.symlink_to(target[how])
        return f"{rank.name}/{file.name}", f"replaced by a {how}"
    if kind == "step":
        name = f"step_{rnd.choice(['9' * 30, '00000001', '1', '-1', '1e3'])}.ckpt"
        for folder in ranks if rnd.random() < 0.5 else [rank]:
            ckpts = sorted(folder.glob("*.ckpt"))
            if ckpts:
                shutil.copyfile(ckpts[0], folder / name)
        return f"{rank.name}/{name}", "added"
    data = file.read_bytes()
    cut = rnd.randrange(len(data) + 1)
    file.write_bytes(data[:cut])
    return f"{rank.name}/{file.name}", f"cut at byte {cut} of {len(data)}"


def _prepare(surface: str, work: Path, rnd: random.Random) -> tuple[str, str, list[str]]:
    """Mutate the copy of the seed in `work`: (target, edit, argv)."""
    if surface == "config":
        source = rnd.choice(sorted(work.glob("*.json")))
        shutil.copyfile(source, work / "config.json")
        flags = rnd.choice([[], [], [], ["-o", "out.msl"]])
        if source.name == "tiny.json" and rnd.random() < 0.3:
            flags = ["--devices", "2", "--per-node", "2"]
        edit = mutate_file(work / "config.json", rnd)
        return f"config.json ({source.name})", edit, ["import", "hf", "config.json", *flags]
    if surface in ("hf-config", "safetensors", "index"):
        target = {"hf-config": "config.json", "safetensors": "model.safetensors"}.get(surface)
        if target is None:
            shards = sorted(p.name for p in (work / "hf").glob("*.safetensors"))
            target = rnd.choice(["model.safetensors.index.json"] * 3 + shards)
        spec = rnd.choice(["tiny.msl", "tiny_tp.msl"]) if surface == "safetensors" else "tiny.msl"
        edit = mutate_file(work / "hf" / target, rnd)
        return f"hf/{target}", edit, ["ckpt", "from-hf", spec, "hf", "-o", "out"]
    if surface == "source":
        edit = mutate_file(work / "init" / "source.json", rnd)
        return "init/source.json", edit, ["ckpt", "to-hf", "tiny.msl", "init", "-o", "out"]
    if surface == "calibration":
        edit = mutate_file(work / "calibration.json", rnd)
        argv = rnd.choice([["report", "run", "--spec", "tiny2.msl"], ["estimate", "tiny2.msl"]])
        return "calibration.json", edit, [*argv, "--calibration", "calibration.json"]
    run = work / ("ranks" if surface == "ranks" else "run")
    argv = rnd.choice([["ckpt", "merge", "tiny_tp.msl", "ranks", "-o", "merged.ckpt"], RESHARD])
    argv = argv if surface == "ranks" else rnd.choice(REPORTS)
    (work / "outside.txt").write_text("a file outside the run\n")
    if rnd.random() < 0.2:
        target, edit = damage_folder(run, rnd)
        return f"{run.name}/{target}", edit, argv
    name = {"ranks": "strategy.json", "run.json": "run.json", "log.csv": "log.csv"}[surface]
    rank = rnd.choice(sorted(run.glob("rank_*")))
    return f"{run.name}/{rank.name}/{name}", mutate_file(rank / name, rnd), argv


def case_surface(seed: int, index: int, surfaces=SURFACES) -> tuple[random.Random, str]:
    rnd = random.Random(f"{seed}/{index}")
    return rnd, rnd.choices(surfaces, [WEIGHTS[s] for s in surfaces])[0]


@contextlib.contextmanager
def prepared(seeds: Seeds, seed: int, index: int, surfaces=SURFACES):
    """(Case, its folder): case `index` of campaign `seed`, ready to run, removed after."""
    rnd, surface = case_surface(seed, index, surfaces)
    folder = seeds.folder(SEED_OF[surface])
    with tempfile.TemporaryDirectory(prefix="msgen-fuzz-") as scratch:
        work = Path(scratch) / "case"
        shutil.copytree(folder, work, symlinks=True)
        target, edit, argv = _prepare(surface, work, rnd)
        yield Case(seed, index, surface, target, edit, tuple(argv)), work


def run_case(seeds: Seeds, seed: int, index: int, surfaces=SURFACES, keep: Path | None = None):
    """Case `index` of campaign `seed`: (Case, exit status, stderr, what is wrong).
    `keep`: a folder to copy the case's files into when something is wrong."""
    with prepared(seeds, seed, index, surfaces) as (case, work):
        with contextlib.chdir(work):
            status, err = call(list(case.argv))
        wrong = failures(list(case.argv), status, err)
        if wrong and keep is not None:
            keep_files(work, keep / str(index), f"{case}\n{wrong}\n{err[-3000:]}\n")
    return case, status, err, wrong


def guarded_case(root: str, seed: int, index: int, surfaces, keep: str | None):
    """run_case in tests.fuzz_guard's worker (arguments and result that pickle)."""
    case, status, err, wrong = run_case(Seeds(Path(root)), seed, index, surfaces,
                                        Path(keep) if keep else None)  # fmt: skip
    return case, status, err[-3000:], wrong


def keep_files(work: Path, to: Path, what: str) -> None:
    """The case's files (a FIFO or a device as the name it had) and what went wrong."""
    shutil.rmtree(to, ignore_errors=True)
    try:
        shutil.copytree(work, to, symlinks=True)
    except shutil.Error:  # a FIFO is not copied; the rest is
        pass
    (to / "CASE.txt").write_text(what)
