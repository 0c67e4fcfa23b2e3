"""`--engine ray`: the same units on Ray's workers, on a cluster (`--ray-address`) or on
a Ray that msgen starts on this machine for the run and stops after it.

A unit is one call on a worker that reads its own input and writes its own files, as
a local worker does, so the files, their order and --resume are the same whatever
the engine; Ray Data's blocks would be repartitioned and reordered between the
reading and the writing, and its writers name files themselves. The workers are Ray
actors, one a CPU, made at start-up: each imports what a unit needs (MindSpore's
FileWriter: seconds of imports) before the run's clock starts, as a forked local
worker inherits msgen's imports, and then takes unit after unit. (Plain Ray tasks
paid those imports inside each worker's first unit: about 3 s of a 15 s run.) The
tokenizer is put in Ray's object store once; each worker loads it once (keyed by
its hash). Every worker must reach the output folder at the same path (a shared
file system). Ray is imported only here, when the engine runs.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

from msgen.data import DataError
from msgen.data.work import Job

RAY_EXTRA = "pip install 'msgen[ray]'"


def import_ray():
    try:
        import ray
    except ImportError as exc:
        raise DataError(f"--engine ray needs Ray ({exc})", RAY_EXTRA) from None
    return ray


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class UnitWorker:
    """One Ray worker of the run (an actor, one CPU): the imports at its start, then
    the units it is given, one at a time."""

    def __init__(self):
        from msgen.data import engines  # noqa: F401  (the unit's code)
        from msgen.data.mindrecord import import_file_writer

        import_file_writer()

    def ready(self) -> int:
        return os.getpid()

    def call(self, kind: str, job: Job, tokenizer_ref: list, unit, key, drop):
        """A unit; the tokenizer is fetched and loaded on the worker's first unit."""
        from msgen.data import engines

        tokenizer_json = None
        if kind == "run" and engines.STATE.get("sha") != job.tokenizer_sha:
            import ray

            tokenizer_json = ray.get(tokenizer_ref[0])
        engines.init_worker(job, tokenizer_json, forked=False)
        return engines.call(kind, unit, key, drop)


class RayEngine:
    name = "ray"

    def __init__(self, workers: int, address: str | None):
        ray = import_ray()
        self.ray, self.started = ray, address is None
        began = time.monotonic()
        package_root = str(Path(__file__).resolve().parents[2])
        env = {"TOKENIZERS_PARALLELISM": "false", "GLOG_v": os.environ.get("GLOG_v", "3")}
        try:
            if address is None:  # a Ray of this run's own, on this machine
                path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
                ray.init(
                    # "local": a new Ray, never one `ray start` left running here (which
                    # ray.init() would join, RAY_ADDRESS's or the last one started)
                    address="local",
                    num_cpus=workers,
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level="ERROR",
                    runtime_env={"env_vars": {**env, "PYTHONPATH": path}},
                )
            else:  # msgen must be installed on the cluster's nodes
                ray.init(address=address, log_to_driver=False, logging_level="ERROR",
                         runtime_env={"env_vars": env})  # fmt: skip
                workers = int(ray.available_resources().get("CPU", 0)) or workers
        except Exception as exc:
            raise DataError(
                f"cannot start Ray{'' if address is None else f' at {address}'}: "
                f"{first_line(exc)}"
            ) from None
        self.ray_startup = time.monotonic() - began
        self.count = workers
        self.actor = ray.remote(num_cpus=1, max_restarts=0, max_task_retries=0)(UnitWorker)
        try:
            self.workers = self.start_workers()
        except BaseException:
            self.close()
            raise
        self.startup = time.monotonic() - began
        self.refs: dict[str, object] = {}

    def start_workers(self) -> list:
        """One worker a CPU, each past its imports (what the start-up counts)."""
        actors = [self.actor.remote() for _ in range(self.count)]
        try:
            self.ray.get([a.ready.remote() for a in actors])
        except self.ray.exceptions.RayError as exc:
            cause = getattr(exc, "cause", None)
            reason = str(cause) if isinstance(cause, DataError) else first_line(exc)
            raise DataError(f"Ray's workers did not start: {reason}") from None
        return actors

    def map(self, kind: str, job: Job, tokenizer_json, tasks) -> Iterator:
        """(unit, result) of each task as they finish; each worker is given the
        plan's next unit when it is free."""
        ray = self.ray
        shipped = []
        if tokenizer_json is not None:
            if job.tokenizer_sha not in self.refs:
                self.refs[job.tokenizer_sha] = ray.put(tokenizer_json)
            shipped = [self.refs[job.tokenizer_sha]]
        job_ref = ray.put(job)
        if self.workers is None:  # stopped by a run cut short
            self.workers = self.start_workers()
        idle, todo, pending = list(self.workers), iter(tasks), {}

        def give():
            while idle and (task := next(todo, None)) is not None:
                actor = idle.pop()
                pending[actor.call.remote(kind, job_ref, shipped, *task)] = (actor, task[0])

        try:
            give()
            while pending:
                (ref,), _ = ray.wait(list(pending), num_returns=1)
                actor, unit = pending.pop(ref)
                result = self.result(ref, unit)
                idle.append(actor)
                give()
                yield unit, result
        finally:
            if pending:  # an error or an interrupt: nothing waits for the units running
                for actor in self.workers:
                    ray.kill(actor)
                self.workers = None

    def result(self, ref, unit):
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, Exception) else exc
            if isinstance(cause, DataError):
                raise DataError(str(cause)) from None
            raise DataError(f"unit {unit.index} ({unit}) failed: {cause}") from None
        except self.ray.exceptions.RayError as exc:
            raise DataError(
                f"unit {unit.index} ({unit}) failed on Ray: {first_line(exc)}"
            ) from None

    def close(self) -> None:
        """Stops the Ray msgen started (and its workers); from a cluster it only
        disconnects, which ends the run's workers there."""
        if self.ray.is_initialized():
            self.ray.shutdown()
