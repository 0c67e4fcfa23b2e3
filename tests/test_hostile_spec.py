"""Hostile specs and what-ifs (round 3): duplicate keyword arguments of the
optimizer and the schedule, integer literals past Python's int_max_str_digits,
a mesh with more stages than devices in the sharding hint, model blocks as large
as a spec may be, and an empty MindRecord path. Each ends in a located diagnostic
and a documented exit code, never a traceback or a silent choice."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from msgen.cli import main
from msgen.compiler import analyze, analyze_text

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "tests" / "cases" / "base.msl"
TINY = ROOT / "specs" / "tiny.msl"
EXIT_ERRORS = 1  # the spec has errors (README: exit codes)


def spec(tmp_path: Path, old: str = "", new: str = "", name: str = "spec.msl") -> Path:
    text = BASE.read_text()
    assert old in text
    path = tmp_path / name
    path.write_text(text.replace(old, new, 1))
    return path


def codes(result) -> list[str]:
    return [d.code for d in result.diagnostics if d.is_error]


# H5: duplicate keyword arguments --------------------------------------------------

OPTIMIZER = "adamw(lr = 1e-3, "
SCHEDULE = "cosine(warmup = 10, "


@pytest.mark.parametrize(
    "old, new, key",
    [
        (OPTIMIZER, "adamw(lr = 1e-3, lr = 5, ", "lr"),
        (SCHEDULE, "cosine(warmup = 10, warmup = 20, ", "warmup"),
    ],
)
def test_a_keyword_given_twice_in_a_spec_is_msl115(tmp_path, old, new, key):
    result = analyze(spec(tmp_path, old, new))
    (d,) = [d for d in result.diagnostics if d.is_error]
    assert (d.code, d.message) == ("MSL115", f"`{key}` is given twice")
    assert d.span.line == 59 + (old == SCHEDULE)  # the key's own line: optimizer, schedule


@pytest.mark.parametrize(
    "flag",
    [
        "train.optimizer=adamw(lr = 1e-3, lr = 5)",
        "train.schedule=cosine(warmup = 10, steps = 200, steps = 300)",
    ],
)
def test_a_keyword_given_twice_in_set_is_msl115(flag):
    result = analyze(BASE, [flag])
    assert codes(result) == ["MSL115"]


def test_the_generated_learning_rate_is_never_the_last_of_two(tmp_path, capsys):
    path = spec(tmp_path, OPTIMIZER, "adamw(lr = 1e-3, lr = 5, ")
    assert main(["compile", str(path), "-o", str(tmp_path / "out")]) == EXIT_ERRORS
    assert not (tmp_path / "out").exists()
    assert "MSL115" in capsys.readouterr().err


# H9: integer literals past int_max_str_digits ---------------------------------------

LONG_ZERO_PADDED = "0" * 4400 + "8"  # the value 8 in 4,401 digits
LONG = "1" * 4400  # past any float


@pytest.mark.parametrize(
    "command", [["check"], ["estimate"], ["fmt", "--check"], ["compile", "-o", "OUT"], ["plan"]]
)
def test_a_zero_padded_literal_is_its_value_in_every_command(tmp_path, capsys, command):
    path = spec(tmp_path, "heads  = 4", f"heads  = {LONG_ZERO_PADDED}")
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in command]
    code = main([argv[0], str(path), *argv[1:]])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    assert code in (0, 1, 3), err  # fmt --check: 3, as the padding is kept
    assert analyze(path).spec.model.dims["heads"] == 8


@pytest.mark.parametrize("command", ["check", "estimate", "fmt", "compile"])
def test_a_long_literal_is_msl006_in_every_command(tmp_path, capsys, command):
    path = spec(tmp_path, "heads  = 4", f"heads  = {LONG}")
    extra = ["-o", str(tmp_path / "out")] if command == "compile" else []
    assert main([command, str(path), *extra]) == EXIT_ERRORS
    err = capsys.readouterr().err
    assert "MSL006" in err and "Traceback" not in err, err


@pytest.mark.parametrize("value", [LONG_ZERO_PADDED, LONG])
def test_long_literals_in_set(value):
    result = analyze(BASE, [f"mesh.tp={value}"])
    want = ["MSL006"] if value == LONG else None
    if want:
        assert codes(result) == want
    else:
        assert result.spec.mesh.tp == 8 and "MSL006" not in codes(result)


@pytest.mark.parametrize(
    "index, code",
    [("0" * 5000 + "0", None), ("0" * 5000 + "1", "MSL309"), ("1" * 5000, "MSL309")],
)
def test_long_device_numbers_in_hccn_conf(tmp_path, index, code):
    lines = [f"address_{index}=10.0.0.1"] if code else []
    if code is None:  # address_000...0 is device 0; then devices 1..7
        lines = [f"address_{index}=10.0.0.1"] + [f"address_{i}=10.0.0.{i + 1}" for i in range(1, 8)]
    (tmp_path / "hccn.conf").write_text("\n".join(lines) + "\n")
    old = 'nodes    = ["192.168.1.10"]'
    path = spec(tmp_path, old, old + '\n    device_ips = hccn("hccn.conf")')
    result = analyze(path)
    if code is None:
        assert codes(result) == []
        assert result.spec.cluster.device_ips[0][0] == "10.0.0.1"
    else:
        assert code in codes(result)
        (d,) = [d for d in result.diagnostics if d.code == code]
        assert "numbers a device past" in d.message or "0..0" in d.message


# H10: more pipeline stages than devices ------------------------------------------


@pytest.mark.parametrize("pp", [9, 16, 1000])
def test_pp_above_the_devices_is_reported_not_a_crash(capsys, pp):
    assert main(["estimate", str(TINY), "--set", "mesh.tp=8", "--set", f"mesh.pp={pp}"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err, err
    assert "MSL201" in err and "MSL301" in err


# H13: checks linear in the model block ------------------------------------------


def model_block(lines: list[str]) -> str:
    return BASE.read_text().replace("model tiny {\n", "model tiny {\n" + "\n".join(lines) + "\n")


def cpu_time(text: str) -> float:
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        analyze_text(text, "big.msl", ROOT)
        best = min(best, time.process_time() - start)
    return best


def test_a_chain_of_dims_is_checked_in_linear_time():
    """Four times the dims cost about four times as much (a set of the later
    names built per dim made it sixteen); a ratio of CPU times in one process,
    never a limit on either."""

    def chain(n):
        return model_block(["    d0 = 1"] + [f"    d{i} = d{i - 1} + 1" for i in range(1, n)])

    small, big = cpu_time(chain(2000)), cpu_time(chain(8000))
    assert big / small < 8, (small, big)


def test_unknown_names_are_hinted_a_bounded_number_of_times(monkeypatch):
    """The closest-name hint scans every dim; past the first 20 unknown names
    (all the text output shows of one code) it is left out, so n unknown names
    cost O(n), not n scans of n dims."""
    from msgen.lowering import evaluate

    calls = []
    real = evaluate.did_you_mean
    monkeypatch.setattr(evaluate, "did_you_mean", lambda *a: calls.append(a) or real(*a))
    result = analyze_text(model_block([f"    u{i} = x{i}" for i in range(300)]), "u.msl", ROOT)
    unknown = [d for d in result.diagnostics if d.code == "MSL101"]
    assert len(unknown) == 300
    assert len(calls) <= 20
    assert unknown[0].hint and unknown[-1].hint is None


# H19: an empty MindRecord path -------------------------------------------------------


@pytest.mark.parametrize(
    "line", ['data = mindrecord("")', 'data = mindrecord("train", valid = "")']
)
def test_an_empty_mindrecord_path_is_not_no_data(tmp_path, capsys, line):
    old = "    schedule     = cosine(warmup = 10, steps = 200, min_lr = 1e-4)\n"
    path = spec(tmp_path, old, old + f"    {line}\n")
    result = analyze(path)
    assert codes(result) == ["MSL108"]
    assert "path is empty" in result.diagnostics[0].message
    assert main(["compile", str(path), "-o", str(tmp_path / "out")]) == EXIT_ERRORS
    assert not (tmp_path / "out").exists()
