"""`msgen plan` searches ep on specs with moe ops, on two specs built from
tests/specs/tiny_moe.msl (tp, pp and zero pinned with --set, so ep is the lever):

- `memory_bound`: one server of 8, dp 8, 64 experts of width 2048 over hidden 1024 in
  12 layers: 12 x 64 x 3 x 1024 x 2048 = 4.83e9 expert parameters, so in fp32 weights,
  gradients and the accumulation buffer of 18 GiB each and Adam's 36 GiB on every
  device with ep = 1 (92 GiB, over the 58 GiB budget), an eighth of that with ep = 8.
  The all-to-all stays inside the server (cheap): ep > 1 is picked.
- `comm_bound`: two servers of 8, tp 8 inside each, dp 2 across them; 8 small experts
  (width 1024) with a capacity, so split over tp, fit. ep = 2 would only add an
  all-to-all across the servers (its group spans tp-strided ranks on both), so ep = 1
  is picked; ep = 2 layouts fit but rank lower. (Dropless the experts are whole on
  every tp rank, and ep = 2 would halve their gradients' all-reduce across the
  servers: it is picked then.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from msgen.cli import main

TINY_MOE = Path(__file__).resolve().parent / "specs" / "tiny_moe.msl"


def spec(tmp_path, name, hidden, ffn, experts, layers, nodes, dp, tp, heads=4, kv=2, extra=""):
    t = TINY_MOE.read_text()
    ips = ", ".join(f'"10.0.0.{i}"' for i in range(1, nodes + 1))
    for old, new in (
        ("hidden   = 64", f"hidden   = {hidden}"),
        ("ffn      = 32", f"ffn      = {ffn}"),
        ("layers   = 2", f"layers   = {layers}"),
        ("seq      = 32", "seq      = 512"),
        ("heads    = 4", f"heads    = {heads}"),
        ("kv_heads = 2", f"kv_heads = {kv}"),
        ("experts = 4, top_k = 2, ffn = ffn, shared_ffn = ffn,", f"experts = {experts}, top_k = 2, ffn = ffn, {extra}"),
        ('nodes    = ["127.0.0.1"]', f"nodes    = [{ips}]"),
        ("    dp = 4\n    tp = 2\n", f"    dp = {dp}\n    tp = {tp}\n"),
        ("global_batch = 8 ", f"global_batch = {2 * dp} "),
    ):  # fmt: skip
        assert old in t, old
        t = t.replace(old, new)
    path = tmp_path / f"{name}.msl"
    path.write_text(t)
    return path


def plans(capsys, path: Path, *sets: str) -> list[dict]:
    argv = ["plan", str(path), "--json", "--top", "50"]
    for s in sets:
        argv += ["--set", s]
    main(argv)
    return json.loads(capsys.readouterr().out)["plans"]


def ep(plan: dict) -> int:
    return int(next(s for s in plan["set"] if s.startswith("mesh.ep=")).split("=")[1])


def test_plan_picks_ep_when_expert_memory_binds_and_the_all_to_all_is_cheap(tmp_path, capsys):
    path = spec(tmp_path, "memory_bound", 1024, 2048, 64, 12, nodes=1, dp=8, tp=1)
    found = plans(capsys, path, "mesh.tp=1", "mesh.pp=1", "train.zero=0")
    assert found and ep(found[0]) > 1
    assert all(ep(p) > 1 for p in found)  # with ep = 1 the experts do not fit


@pytest.mark.parametrize("capacity", [True, False])
def test_plan_keeps_ep_1_when_the_all_to_all_crosses_servers_for_nothing(
    tmp_path, capsys, capacity
):
    extra = "capacity = 1.0," if capacity else ""
    path = spec(tmp_path, "comm_bound", 1024, 1024, 8, 4, 2, 2, 8, heads=16, kv=8, extra=extra)
    found = plans(capsys, path, "mesh.tp=8", "mesh.pp=1", "train.zero=0")
    assert ep(found[0]) == (1 if capacity else 2)
    assert any(ep(p) == 2 for p in found) and any(ep(p) == 1 for p in found)


def test_a_dense_spec_searches_no_ep(capsys):
    root = Path(__file__).resolve().parents[1]
    found = plans(capsys, root / "specs" / "tiny_llama.msl", "mesh.tp=2", "mesh.pp=2")
    assert found and not any(s.startswith("mesh.ep") for p in found for s in p["set"])
