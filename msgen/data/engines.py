"""Who runs the units: this process (`--workers 1`), a pool of worker processes on
this machine (`--workers N`), or Ray (msgen.data.ray_engine). Each hands back the
units' results as they finish; the order the dataset takes is the plan's, whatever
the order of finishing.

A worker tokenizes on one core (the tokenizers library's own threads are off), so
N workers use N cores. Worker processes are forked from msgen's, with its imports
in place, and die with it (PR_SET_PDEATHSIG): a run killed with SIGKILL leaves no
worker writing into a folder the next run resumes.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager

from msgen.data import DataError
from msgen.data.units import Unit
from msgen.data.work import Job, failed, hash_unit, run_unit, sample_unit

PARALLELISM = "TOKENIZERS_PARALLELISM"
# docs/data.md's bound on a worker's peak resident memory above what it held when it
# started (msgen's, forked), beside the MindRecord index of its unit (INDEX_BYTES a
# window): what tests/test_data_memory.py holds.
WORKER_BOUND = 256 << 20
INDEX_BYTES = 1400
PR_SET_PDEATHSIG = 1
STATE: dict = {}  # the worker's job and tokenizer, set once per worker


def load_tokenizer(text: str):
    from tokenizers import Tokenizer

    from msgen.data.tokenizer import plain_text

    tokenizer = Tokenizer.from_str(text)
    plain_text(tokenizer, "the tokenizer")
    return tokenizer


def init_worker(job: Job, tokenizer_json: str | None, forked: bool = True) -> None:
    """Once per worker: the job, and the tokenizer read from its JSON."""
    os.environ[PARALLELISM] = "false"
    if forked:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # msgen itself stops the workers
        try:
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except (OSError, AttributeError):  # not Linux: the pool's own checks remain
            pass
    STATE["job"] = job
    if tokenizer_json is not None and STATE.get("sha") != job.tokenizer_sha:
        STATE["tokenizer"], STATE["sha"] = load_tokenizer(tokenizer_json), job.tokenizer_sha


def call(kind: str, unit: Unit, key: str, drop) -> object:
    """One task in a worker: `run` (tokenize and write), `hash` (for --dedup), or
    `sample` (texts for --train-tokenizer; `key` is then the sample fraction)."""
    job = STATE["job"]
    try:
        if kind == "run":
            return run_unit(unit, job, STATE["tokenizer"], key, drop)
        if kind == "hash":
            return hash_unit(unit, job)
        return sample_unit(unit, job, key, drop)
    except Exception as exc:
        raise failed(unit, exc) from None


Task = tuple[Unit, object, frozenset]  # a unit, its key (or sample fraction), its drops


class LocalEngine:
    name = "local"

    def __init__(self, workers: int):
        self.workers = workers
        self.startup = 0.0

    def map(self, kind: str, job: Job, tokenizer_json, tasks: list[Task]) -> Iterator:
        """(unit, result) of each task, as they finish."""
        if self.workers == 1 or len(tasks) <= 1:
            yield from self.here(kind, job, tokenizer_json, tasks)
            return
        import multiprocessing

        pool = ProcessPoolExecutor(
            min(self.workers, len(tasks)),
            mp_context=multiprocessing.get_context("fork"),
            initializer=init_worker,
            initargs=(job, tokenizer_json),
        )
        try:
            pending = {pool.submit(call, kind, *task): task[0] for task in tasks}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    unit = pending.pop(future)
                    yield unit, outcome(future, unit, pending.values())
        finally:
            stop(pool)

    def here(self, kind, job, tokenizer_json, tasks) -> Iterator:
        with parallelism_off():
            init_worker(job, tokenizer_json, forked=False)
            for task in tasks:
                yield task[0], call(kind, *task)

    def close(self) -> None:
        pass


def outcome(future, unit: Unit, running) -> object:
    try:
        return future.result()
    except BrokenProcessPool:
        names = ", ".join(str(u) for u in sorted([unit, *running], key=lambda u: u.index)[:3])
        raise DataError(
            f"a worker process died (killed, or out of memory) while working on {names}",
            "see the system log (dmesg) for the out-of-memory killer, or lower --workers",
        ) from None


def stop(pool: ProcessPoolExecutor) -> None:
    """End the workers now: on an error or an interrupt nothing waits for the units
    still running."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.is_alive():
            process.kill()
    for process in processes:
        process.join()


@contextmanager
def parallelism_off():
    """One core in this process too: the library reads the variable at every call."""
    before = os.environ.get(PARALLELISM)
    os.environ[PARALLELISM] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PARALLELISM, None)
        else:
            os.environ[PARALLELISM] = before
