"""The `nestflow` command: the digits demo (reduced), `show`, and the rnn dispatch."""

import re
import subprocess
import sys

import pytest

import nestflow as nf
from nestflow.cli.main import main


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The full default demo (all 1797 digits, 20 epochs, seed 0: about 3 s) through
    `python -m nestflow`, as `make demo` runs it."""
    out = tmp_path_factory.mktemp("cli") / "model"
    args = ["demo", "--out", str(out)]
    result = subprocess.run(
        [sys.executable, "-m", "nestflow", *args], capture_output=True, text=True, timeout=120
    )
    return result, out


def test_demo_trains_saves_and_reloads_identically(demo_run):
    """Issue 3 acceptance: the digits demo reaches >= 97% held-out accuracy at its fixed seed
    and the reloaded model gives the same predictions bit for bit."""
    result, out = demo_run
    assert result.returncode == 0, result.stdout + result.stderr
    accuracy = float(re.search(r"^test accuracy: ([\d.]+)%", result.stdout, re.M).group(1))
    reloaded = float(re.search(r"reloaded model test accuracy: ([\d.]+)%", result.stdout).group(1))
    assert "359 held-out" in result.stdout  # the whole data set, not a reduced run
    assert accuracy >= 97.0
    assert reloaded == accuracy
    assert "identical bit for bit: True" in result.stdout
    assert re.search(r"^done in [\d.]+ s$", result.stdout, re.M)
    # model.json and the one program and parameter file it names (issue 12: no leftovers)
    names = sorted(p.name for p in out.iterdir())
    assert len(names) == 3 and names[1] == "model.json", names
    assert re.fullmatch(r"model\.[0-9a-f]{16}\.pb", names[0])
    assert re.fullmatch(r"params\.[0-9a-f]{16}\.safetensors", names[2])


def test_demo_progress_is_one_line_per_epoch_off_a_terminal(demo_run):
    """Issue 16: with stdout not a terminal (a log file, a pipe) the progress is one line per
    epoch with its loss, accuracy and held-out values, and no bar redraws anywhere."""
    result, _ = demo_run
    line = (
        r"^epoch (\d+)/20: loss [\d.]+, acc [\d.]+, eval_loss [\d.]+, eval_acc [\d.]+ "
        r"\(45 steps, [\d.]+ s\)$"
    )
    assert re.findall(line, result.stdout, re.M) == [str(e) for e in range(1, 21)]
    assert "\r" not in result.stdout + result.stderr and result.stderr == ""


def test_demo_without_out_leaves_no_temporary_directory(tmp_path, monkeypatch, capsys):
    """Issue 16: the inference model goes to a temporary directory that is removed."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    args = ["demo", "--epochs", "1", "--limit", "200", "--no-progress", "--min-accuracy", "0"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "removed at exit" in text and "identical bit for bit: True" in text
    assert list(tmp_path.iterdir()) == []


def test_demo_fails_when_accuracy_is_below_the_bar(tmp_path, capsys):
    status = main(
        ["demo", "--epochs", "1", "--limit", "200", "--out", str(tmp_path / "m"), "--no-progress"]
        + ["--min-accuracy", "1.01"]
    )
    assert status == 1
    assert "below the required" in capsys.readouterr().out


def test_show_prints_the_saved_program(demo_run, capsys):
    _, out = demo_run
    assert main(["show", str(out)]) == 0
    text = capsys.readouterr().out
    assert "feed:  x" in text
    assert "param hidden.w: float32[64, 128]" in text
    assert "= mul(X=['x'], Y=['hidden.w'])" in text and "softmax" in text
    # Pruned for inference: no loss, gradient or optimizer ops.
    assert "adam" not in text and "@GRAD" not in text and "cross_entropy" not in text


def test_show_reads_a_program_file(tmp_path, capsys):
    nf.layers.relu(nf.data("x", shape=[-1, 2]))
    (tmp_path / "p.pb").write_bytes(nf.default_main_program().to_bytes())
    assert main(["show", str(tmp_path / "p.pb")]) == 0
    assert "= relu(X=['x'])" in capsys.readouterr().out


def test_show_of_a_bad_directory_is_a_clean_error(tmp_path, capsys):
    assert main(["show", str(tmp_path)]) == 1
    assert "holds no saved model" in capsys.readouterr().err


def test_rnn_demo_dispatches_or_explains(monkeypatch, capsys):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    assert main(["demo", "--model", "rnn"]) == 2
    assert "'rnn' demo is not available" in capsys.readouterr().err


def test_rnn_demo_dispatches_to_its_module(monkeypatch):
    import importlib.machinery
    import types

    fake = types.ModuleType("nestflow.cli.demo_rnn")
    fake.__spec__ = importlib.machinery.ModuleSpec("nestflow.cli.demo_rnn", None)
    seen = []
    fake.run = lambda args: seen.append(args.epochs) or 0
    monkeypatch.setitem(sys.modules, "nestflow.cli.demo_rnn", fake)
    assert main(["demo", "--model", "rnn", "--epochs", "2"]) == 0
    assert seen == [2]


@pytest.mark.parametrize("model", ["mlp", "conv"])
def test_a_demo_trains_on_the_stand_in_device(model):
    """DESIGN Places: `nestflow demo --place standin` runs the demo's device code path (the
    GPU's, with NumPy memory behind a CuPy-like module) to the end, reload included."""
    args = ["demo", "--model", model, "--place", "standin", "--epochs", "1", "--limit", "300"]
    result = subprocess.run(
        [sys.executable, "-m", "nestflow", *args, "--no-progress", "--min-accuracy", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test accuracy" in result.stdout
