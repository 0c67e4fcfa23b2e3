"""`msgen data --engine ray` on a local Ray of 2 CPUs the test starts: the bytes
--workers 2 writes, and a raising task named by its source file. Ray comes with the
test extra (pip install -e '.[test]'); msgen imports it only for --engine ray."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.data_fixtures import ROOT, msgen
from tests.test_data_engines import UNIT, corpus, files_of, spec_for, tokenizer_file
from tests.test_data_gz import corpora, data_files, written

__all__ = ["corpora", "corpus", "tokenizer_file"]  # the fixtures, shared


@pytest.fixture(scope="module")
def ray_cluster():
    """A Ray head of 2 CPUs on this machine, started as on a cluster node (`ray
    start --head`), stopped at the end; msgen joins it with --ray-address."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Ray 2.60's `ray start` turns token authentication on when ~/.ray/auth_token
    # exists (which any earlier ray.init() of a local Ray writes), and a client given
    # an address then needs RAY_AUTH_MODE=token: off here, so that the test does not
    # depend on what ran before it on the machine (docs/data.md: clusters with tokens)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3", "RAY_AUTH_MODE": "disabled"}
    ray_cli = [sys.executable, "-m", "ray.scripts.scripts"]
    started = subprocess.run([*ray_cli, "start", "--head", "--num-cpus=2", f"--port={port}",
                              "--include-dashboard=false", "--disable-usage-stats"],
                             env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert started.returncode == 0, started.stderr[-2000:]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([*ray_cli, "stop", "--force"], env=env, capture_output=True, timeout=300)


@pytest.mark.slow
def test_ray_writes_the_bytes_workers_write(tmp_path, corpus, tokenizer_file):
    spec = spec_for(tmp_path)
    args = ["data", spec, corpus, "--tokenizer", tokenizer_file, "--unit-size", str(UNIT),
            "--valid", "0.1"]  # fmt: skip
    status, _, err = msgen(*args, "-o", tmp_path / "local", "--workers", "2")
    assert status == 0, err
    status, _, err = msgen(*args, "-o", tmp_path / "ray", "--engine", "ray", "--workers", "2")
    assert status == 0, err
    assert "(Ray)" in err and "Ray's start-up" in err
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "local")


def test_msgen_and_its_help_do_not_import_ray():
    code = (
        "import sys, contextlib, io\n"
        "import msgen, msgen.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        msgen.cli.main(['data', '--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print('ray' in sys.modules, 'msgen.data.ray_engine' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT)}, timeout=120)  # fmt: skip
    assert out.stdout.split() == ["False", "False"], out.stderr


@pytest.mark.slow
def test_ray_cluster_of_two_cpus(tmp_path, corpus, tokenizer_file, ray_cluster):
    """msgen joins a running cluster (--ray-address) and leaves it running."""
    spec = spec_for(tmp_path)
    args = ["data", spec, corpus, "--tokenizer", tokenizer_file, "--unit-size", str(UNIT)]
    status, _, err = msgen(*args, "-o", tmp_path / "local", "--workers", "2")
    assert status == 0, err
    # in a process of its own, as a user runs it: a Ray the test process started and shut
    # down before (the other tests' in-process runs) leaves state a second ray.init()
    # in the same process trips on
    joined = subprocess.run(
        [sys.executable, "-m", "msgen.cli", *map(str, args), "-o", str(tmp_path / "ray"),
         "--engine", "ray", "--ray-address", ray_cluster],
        env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert joined.returncode == 0, joined.stderr[-2000:]
    assert files_of(tmp_path / "ray") == files_of(tmp_path / "local")


@pytest.mark.slow
def test_ray_reads_a_gz_as_the_workers_do(tmp_path, corpora, tokenizer_file, monkeypatch):
    """A `.gz` is one unit on Ray too: the bytes of the uncompressed copy unsplit. And
    msgen's own Ray is a new one even where a cluster is named (RAY_ADDRESS, or the
    last `ray start` on the machine), which ray.init() would otherwise join."""
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    plain, zipped, unit = corpora
    ray = written(tmp_path, zipped, tokenizer_file, "ray", "--unit-size", str(unit),
                  "--engine", "ray", "--workers", "2")  # fmt: skip
    whole = written(tmp_path, plain, tokenizer_file, "whole", "--unit-size", "1M")
    assert len(data_files(ray)) == 3 * 2
    assert data_files(ray) == data_files(whole)
