"""`--engine ray`: the same units as Ray tasks, on a cluster (`--ray-address`) or on a
Ray that msgen starts on this machine for the run and stops after it.

Tasks, not Ray Data: a unit is one task that reads its own input and writes its own
files, as a local worker does, so the files, their order and --resume are the same
whatever the engine; Ray Data's blocks would be repartitioned and reordered between
the reading and the writing, and its writers name files themselves. The tokenizer is
put in Ray's object store once; each Ray worker loads it once (keyed by its hash).
Every worker must reach the output folder at the same path (a shared file system).
Ray is imported only here, when the engine runs.
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


def ray_task(kind: str, job: Job, tokenizer_ref: list, unit, key, drop):
    """A unit in a Ray worker; the tokenizer is fetched and loaded on its first unit."""
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
                    num_cpus=workers,
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level="ERROR",
                    runtime_env={"env_vars": {**env, "PYTHONPATH": path}},
                )
            else:  # msgen must be installed on the cluster's nodes
                ray.init(address=address, log_to_driver=False, logging_level="ERROR",
                         runtime_env={"env_vars": env})  # fmt: skip
        except Exception as exc:
            raise DataError(
                f"cannot start Ray{'' if address is None else f' at {address}'}: "
                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            ) from None
        self.startup = time.monotonic() - began
        self.remote = ray.remote(num_cpus=1, max_retries=0)(ray_task)
        self.refs: dict[str, object] = {}
        self.job_ref = None

    def map(self, kind: str, job: Job, tokenizer_json, tasks) -> Iterator:
        ray = self.ray
        shipped = []
        if tokenizer_json is not None:
            if job.tokenizer_sha not in self.refs:
                self.refs[job.tokenizer_sha] = ray.put(tokenizer_json)
            shipped = [self.refs[job.tokenizer_sha]]
        job_ref = ray.put(job)
        pending = {self.remote.remote(kind, job_ref, shipped, *task): task[0] for task in tasks}
        try:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    unit = pending.pop(ref)
                    yield unit, self.result(ref, unit)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)

    def result(self, ref, unit):
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, Exception) else exc
            if isinstance(cause, DataError):
                raise DataError(str(cause)) from None
            raise DataError(f"unit {unit.index} ({unit}) failed: {cause}") from None
        except self.ray.exceptions.RayError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DataError(f"unit {unit.index} ({unit}) failed on Ray: {first}") from None

    def close(self) -> None:
        """Stops the Ray msgen started; from a cluster it only disconnects."""
        if self.ray.is_initialized():
            self.ray.shutdown()
