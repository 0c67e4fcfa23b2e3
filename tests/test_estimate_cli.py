"""`msgen estimate`: the text table, --json, --set, --svg, and exit codes."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from test_estimate import SPECS

from msgen.cli import main

GPT7B = str(SPECS / "gpt7b.msl")
KORTHIKANTI = str(SPECS / "validation" / "korthikanti22b.msl")

STAGE_KEYS = {
    "stage", "layers", "params", "weights_bytes", "grads_bytes", "accumulation_bytes",
    "optimizer_bytes", "activation_bytes_per_layer", "in_flight_micro_batches",
    "activations_bytes", "other_activations_bytes", "logits_bytes", "hccl_bytes",
    "headroom_bytes", "total_bytes", "fits",
}  # fmt: skip


def run(capsys, *argv):
    code = main(["estimate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def as_json(capsys, *argv):
    code, out, _ = run(capsys, *argv, "--json")
    return code, json.loads(out)


def test_text_table(capsys):
    code, out, _ = run(capsys, GPT7B)
    assert code == 0
    for row in ("weights", "grads", "accumulation", "optimizer", "activations",
                "other activations", "logits", "HCCL", "total", "headroom", "verdict"):  # fmt: skip
        assert f"\n  {row} " in out
    assert "16.00 MiB per layer x 32 layers x 1 in flight" in out
    assert "45.03 GiB   of the 58.00 GiB budget" in out
    assert out.rstrip().endswith("fits: every stage within 58.00 GiB per device")


def test_json_schema(capsys):
    code, doc = as_json(capsys, GPT7B)
    assert code == 0
    assert {"params_total", "devices", "budget_bytes", "stages"} <= set(doc)
    assert doc["params_total"] == 6_658_596_864 and doc["devices"] == 8
    (stage,) = doc["stages"]
    assert STAGE_KEYS <= set(stage)
    assert isinstance(stage["layers"], int) and stage["layers"] == 32
    assert stage["activations_bytes"] == (
        stage["activation_bytes_per_layer"] * stage["layers"] * stage["in_flight_micro_batches"]
    )
    rows = [k for k in STAGE_KEYS if k.endswith("_bytes") and k not in
            ("headroom_bytes", "total_bytes", "activation_bytes_per_layer")]  # fmt: skip
    assert stage["total_bytes"] == sum(stage[k] for k in rows)


def test_set_overrides_change_the_estimate(capsys):
    _, base = as_json(capsys, GPT7B)
    sets = ["--set", "mesh.dp=2", "--set", "mesh.tp=4", "--set", "pipeline.micro_batches=128"]
    code, wider = as_json(capsys, GPT7B, *sets)
    assert code == 0 and wider["mesh"] == {"dp": 2, "tp": 4, "pp": 1}
    assert wider["stages"][0]["params"] < base["stages"][0]["params"]
    code, none = as_json(capsys, GPT7B, "--set", "recompute.decoder=none")
    assert code == 0
    assert none["stages"][0]["activation_bytes_per_layer"] == 38 * 2048 * 4096  # 38 sbh, b = 1
    code, out, _ = run(capsys, GPT7B, "--set", "recompute.decoder=none")
    assert "what-if: --set recompute.decoder=none" in out


def test_over_budget_prints_everything_and_exits_1(capsys):
    code, out, err = run(capsys, KORTHIKANTI)
    assert code == 1
    assert "59.25 GiB" in out and "OVER BUDGET by 27.54 GiB" in out
    assert out.rstrip().endswith("(MSL401 above lists changes that would fit)")
    assert "error[MSL401]" in err
    code, doc = as_json(capsys, KORTHIKANTI)
    assert code == 1 and doc["fits"] is False


def test_other_errors_print_no_estimate(capsys):
    code, out, err = run(capsys, GPT7B, "--set", "mesh.tp=3")
    assert code == 1 and out == "" and "error[" in err


def test_svg(tmp_path, capsys):
    path = tmp_path / "stages.svg"
    code, _, _ = run(capsys, str(SPECS / "llama13b.msl"), "--svg", str(path))
    assert code == 0
    first = path.read_bytes()
    root = ET.fromstring(first)
    assert root.tag.endswith("svg")
    text = first.decode()
    for label in ("weights", "activations", "HCCL", "headroom (10%, not added)", "budget 58.00 GiB",
                  "GiB per device", "pipeline stage"):  # fmt: skip
        assert label in text
    assert text.count('fill="url(#headroom)"') == 2 + 1  # a hatch per stage, and the legend's
    run(capsys, str(SPECS / "llama13b.msl"), "--svg", str(path))
    assert path.read_bytes() == first
    assert [p.name for p in tmp_path.iterdir()] == ["stages.svg"]  # no temporary left


def test_svg_to_a_missing_folder_is_a_usage_error(tmp_path, capsys):
    code, _, err = run(capsys, GPT7B, "--svg", str(tmp_path / "no" / "such.svg"))
    assert code == 2 and "cannot write" in err
