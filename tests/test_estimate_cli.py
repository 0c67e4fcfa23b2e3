"""`msgen estimate`: the text table, --json, --set, --svg, and exit codes."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from test_estimate import SPECS

from msgen.cli import main
from msgen.estimate.report import ROWS as ROW_NAMES

GPT7B = str(SPECS / "gpt7b.msl")
KORTHIKANTI = str(SPECS / "validation" / "korthikanti22b.msl")

STAGE_KEYS = {
    "stage", "layers", "params", "weights_bytes", "grads_bytes", "accumulation_bytes",
    "optimizer_bytes", "activation_bytes_per_layer", "in_flight_micro_batches",
    "activations_bytes", "other_activations_bytes", "logits_bytes", "recompute_working_bytes",
    "hccl_bytes", "headroom_bytes", "total_bytes", "fits",
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
                "other activations", "logits", "recompute working", "HCCL", "total", "headroom",
                "verdict"):  # fmt: skip
        assert f"\n  {row} " in out
    assert "16.00 MiB per layer x 32 layers x 1 in flight" in out
    assert "38.81 GiB   of the 58.00 GiB budget" in out
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
    assert code == 0 and wider["mesh"] == {"dp": 2, "tp": 4, "pp": 1, "ep": 1}
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


# The estimate as data ----------------------------------------------------------

EXPECTED = Path(__file__).resolve().parent / "expected" / "estimate"
SCHEMA = Path(__file__).resolve().parents[1] / "docs" / "estimate.schema.json"


def test_gpt7b_text_is_the_golden_file(capsys, monkeypatch):
    """`msgen estimate specs/gpt7b.msl`, as a user runs it from the repository top;
    a change to the estimate's text shows in this file's diff."""
    monkeypatch.chdir(SPECS.parent)
    code, out, _ = run(capsys, "specs/gpt7b.msl")
    assert code == 0
    assert out == (EXPECTED / "gpt7b.txt").read_text(encoding="utf-8")


def test_the_published_json_schema_is_the_models():
    """docs/estimate.schema.json is EstimateReport's schema (regenerate it with
    `json.dumps(EstimateReport.model_json_schema(), indent=2)` when the models change)."""
    from msgen.estimate.output import EstimateReport

    want = json.dumps(EstimateReport.model_json_schema(), indent=2) + "\n"
    assert SCHEMA.read_text(encoding="utf-8") == want


def closed(schema):
    """The schema with every object closed to keys it does not name, so a key the
    output adds without the published schema saying so is an error too."""
    if isinstance(schema, dict):
        out = {k: closed(v) for k, v in schema.items()}
        if "properties" in out:
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    return schema


@pytest.mark.parametrize("spec", ["gpt7b.msl", "llama13b.msl", "validation/korthikanti22b.msl"])
def test_json_output_validates_against_the_published_schema(capsys, spec):
    """Against docs/estimate.schema.json, the file users read, by a JSON Schema
    validator: not against the models that produced the output."""
    import jsonschema

    _, doc = as_json(capsys, str(SPECS / spec))
    schema = closed(json.loads(SCHEMA.read_text(encoding="utf-8")))
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(doc)


@pytest.mark.parametrize("spec", ["gpt7b.msl", "llama13b.msl", "validation/gpt1t_4096.msl"])
def test_svg_bar_heights_are_the_numbers(tmp_path, capsys, spec):
    """Every segment of every stage's bar is its row's bytes on one scale, stacked in
    the table's order, and the budget line sits at the budget on that scale."""
    path = tmp_path / "stages.svg"
    _, doc = as_json(capsys, str(SPECS / spec))
    run(capsys, str(SPECS / spec), "--svg", str(path))
    ns = {"s": "http://www.w3.org/2000/svg"}
    root = ET.fromstring(path.read_bytes())
    segments: dict[int, list[tuple[str, float, float]]] = {}
    for rect in root.findall("s:rect", ns):
        title = rect.find("s:title", ns)
        if title is None or "headroom" in title.text:
            continue
        stage, rest = title.text.removeprefix("stage ").split(" ", 1)
        name = rest.split(":")[0]
        y, height = float(rect.get("y")), float(rect.get("height"))
        segments.setdefault(int(stage), []).append((name, y, height))
    rows = dict(ROW_NAMES)
    axis = root.findall("s:line", ns)
    bottom = max(float(line.get("y1")) for line in axis if line.get("stroke") == "#000000")
    want = {
        stage["stage"]: [(rows[k], stage[k]) for k in rows if stage[k]] for stage in doc["stages"]
    }
    assert {s: [name for name, _, _ in d] for s, d in segments.items()} == {
        s: [name for name, _ in w] for s, w in want.items()
    }
    # pixels per byte, from the tallest stack's top (one rounded figure); every
    # segment then sits on that scale within its own rounding
    tallest = max(want, key=lambda s: sum(v for _, v in want[s]))
    top = min(y for _, y, _ in segments[tallest])
    scale = (bottom - top) / sum(v for _, v in want[tallest])
    for s in want:
        base = bottom
        for (name, y, height), (_, value) in zip(segments[s], want[s], strict=True):
            assert abs(height - value * scale) <= 0.11, (s, name, height, value * scale)
            assert abs(y + height - base) <= 0.1 + 1e-6  # stacked; each figure rounds to 0.1
            base = y
    budget = [
        line for line in axis if line.get("stroke-dasharray") and line.get("x1") != line.get("x2")
    ]
    assert abs(bottom - float(budget[0].get("y1")) - doc["budget_bytes"] * scale) <= 0.15
