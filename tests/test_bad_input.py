"""Bad input, everywhere: a table-driven walk over every option and file argument of every command.

The cases are generated from the commands' own signatures (so a new option is walked the day it
is added): a malformed and an out-of-range value for each number, a nonsense word for each word,
a missing path, an empty file, an empty folder and another tool's file for each file argument,
and an output path that cannot be created. Each must be refused with one line and exit 2 before
any work: model forwards and the geometry are patched to fail loudly if they are ever reached.
"""

from __future__ import annotations

import inspect
import json
import typing
from pathlib import Path

import pytest
import torch

from geoprobe.cli.app import app
from tests.helpers import copy_run, invoke


# Every command with arguments that make it valid and cheap; the bad value of each case is
# appended (the last occurrence of an option wins) or replaces the placeholder of a file argument.
BASE = {
    "extract": ["extract", "{model}", "--corpus", "{corpus}", "--tokens", "100", "--out", "{new}"],
    "scan": ["scan", "{model}", "--corpus", "{corpus}", "--tokens", "100", "--anchors", "16", "--k", "4",
             "--pairs", "64", "--out", "{new}"],
    "geometry": ["geometry", "{run}"],
    "rank": ["rank", "{run}"],
    "bridge": ["bridge", "--run", "{run}", "--layer", "1", "--out", "{new}"],
    "sweep": ["sweep", "--run", "{run}"],
    "dsl train": ["dsl", "train", "--corpus", "{corpus}", "--tokenizer", "words", "--out", "{new}"],
    "baseline train": ["baseline", "train", "sed", "--corpus", "{corpus}", "--tokenizer", "words", "--out", "{new}"],
    "sample": ["sample", "--model", "{dsl}"],
    "nll": ["nll", "--model", "{dsl}", "--corpus", "{corpus}"],
    "eval": ["eval", "{samples}", "--evaluator", "{model}", "--references", "{corpus}"],
    "compare": ["compare", "{evaluated}", "--out", "{new}"],
    "report": ["report", "{run}"],
    "demo": ["demo", "--tiny", "--out", "{new}"],  # the testbed: its first forward comes in seconds
}

# Values a generated case would call bad that are in fact meaningful, each with its reason.
LEGAL = {
    ("*", "--layer", "0"): "layer 0 is the embedding output",
    ("*", "--seed", "0"): "the default seed",
    ("*", "--rank", "0"): "the first rank",
    ("*", "--bootstrap", "0"): "no bootstrap",
    ("*", "--reseeds", "0"): "no redraws",
    ("*", "--text-field", "bogus!"): "any JSON field name; a .txt corpus has none to check",
    ("*", "--eval-every", "0"): "0 = the default: every min(50, --steps/40) steps for a bridge, no evaluations for dsl train",
    ("*", "--min-steps", "0"): "no minimum before the plateau rule may stop",
    ("*", "--doc-blocks", "0"): "0 = every block of a document",
    ("*", "--shard-rows", "0"): "0 = about 64 MiB of states per shard",
    ("*", "--skip-first", "0"): "keep the first position",
    ("*", "--warmup", "0"): "no warmup",
    ("*", "--save-every", "0"): "0 = no resumable checkpoint, the final weights only",
    ("bridge", "--d-model", "0"): "0 = the default width for d and the layer (bridge_shape)",
    ("bridge", "--n-layers", "0"): "0 = the default depth for the layer (bridge_shape)",
    ("bridge", "--n-heads", "0"): "0 = about 64 channels a head, dividing the width",
    ("sweep", "--d-model", "0"): "0 = the default width for d and the layer (bridge_shape)",
    ("sweep", "--n-layers", "0"): "0 = the default depth for the layer (bridge_shape)",
    ("sweep", "--n-heads", "0"): "0 = about 64 channels a head, dividing the width",
    ("*", "--conv-window", "0"): "0 = no input convolution (the bridges before 2026-12-02's afternoon)",
}

FREE_WORDS = {"--text-field"}  # options whose value is any word


def commands():
    def walk(typer_app, prefix=()):
        for command in typer_app.registered_commands:
            yield " ".join(prefix + (command.name or command.callback.__name__.replace("_", "-"),)), command.callback
        for group in typer_app.registered_groups:
            yield from walk(group.typer_instance, prefix + (group.name,))
    return dict(walk(app))


def parameters(callback):
    """(flag or None for a positional argument, python type, minimum) of every parameter."""
    for name, p in inspect.signature(callback, eval_str=True).parameters.items():
        base, info = typing.get_args(p.annotation)[:2]
        args = [a for a in typing.get_args(base) if a is not type(None)]
        kind = args[0] if args and typing.get_origin(base) is not list else base
        if typing.get_origin(base) is list:
            kind = list
        decls = [d for d in (getattr(info, "param_decls", None) or ()) if d.startswith("--")]
        positional = type(info).__name__ == "ArgumentInfo"
        yield (None if positional else (decls[0] if decls else "--" + name.replace("_", "-"))), name, kind, \
            getattr(info, "min", None)


def bad_values(flag: str, kind, minimum) -> list[str]:
    if kind is bool:
        return []
    if kind is int:
        values = ["x", "-1", "2.5"]
        if minimum is None or minimum <= 0:
            values.append("0")
        return values
    if kind is float:
        return ["x", "-1", "nan", "inf"]
    if kind is str:
        return [] if flag in FREE_WORDS else ["bogus!"]
    return []


def cases():
    out = []
    table = commands()
    assert set(table) == set(BASE), f"a command without a baseline: {set(table) ^ set(BASE)}"
    for command, callback in table.items():
        for flag, name, kind, minimum in parameters(callback):
            if flag is None:
                if kind in (Path, list) or name in ("model", "run", "samples"):
                    out += [(command, f"<{name}>", how) for how in ("missing", "empty-file", "empty-dir", "foreign")]
                continue
            if kind is Path and flag in ("--out", "--reference-features"):  # folders a command writes
                out.append((command, flag, "under-a-file"))
                continue
            if kind in (Path, list):
                out += [(command, flag, how) for how in ("missing", "empty-file", "empty-dir", "foreign")]
                continue
            for value in bad_values(flag, kind, minimum):
                if ("*", flag, value) not in LEGAL and (command, flag, value) not in LEGAL:
                    out.append((command, flag, value))
    return out


CASES = cases()


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_models, corpus_txt, scanned_run):
    """The valid things the baselines point at: a model, a corpus, a scanned run, a DSL checkpoint,
    a samples file and an evaluated one, and the bad files of every kind."""
    root = tmp_path_factory.mktemp("bad-input")
    model = tiny_models("llama")
    run, dsl = copy_run(scanned_run, root / "run"), root / "dsl"
    ok = lambda *argv: invoke(*argv)[0] == 0
    assert ok("-q", "dsl", "train", "--corpus", corpus_txt, "--tokenizer", "words", "--steps", 2, "--batch-size", 2,
              "--seq-len", 16, "--d-model", 16, "--n-layers", 1, "--out", dsl, "--device", "cpu")
    assert ok("-q", "sample", "--model", dsl, "--num", 2, "--length", 8, "--out", root / "samples", "--device", "cpu")
    samples = evaluated = root / "samples" / "samples.jsonl"
    assert ok("-q", "eval", evaluated, "--evaluator", model, "--references", corpus_txt, "--device", "cpu")
    (root / "empty.txt").write_text("")
    (root / "empty-dir").mkdir()
    (root / "foreign").mkdir()
    (root / "foreign" / "config.json").write_text(json.dumps({"model_type": "not-ours", "vocab_size": 3}))
    (root / "foreign" / "notes.jsonl").write_text('{"title": "no text field"}\n')
    (root / "a-file").write_text("not a folder")
    return {"model": str(model), "corpus": str(corpus_txt), "run": str(run), "dsl": str(dsl),
            "samples": str(samples), "evaluated": str(evaluated), "root": root}


BAD_PATH = {"missing": "nowhere/at/all", "empty-file": "empty.txt", "empty-dir": "empty-dir", "foreign": "foreign"}


def argv_for(case, world, new: Path) -> list[str]:
    command, flag, value = case
    fill = {k: v for k, v in world.items() if k != "root"} | {"new": str(new)}
    argv = [a.format(**fill) for a in BASE[command]] + (["--device", "cpu"] if _has(command, "--device") else [])
    if flag.startswith("<"):  # a positional file argument: replace its placeholder
        name = flag[1:-1]
        bad = str(world["root"] / BAD_PATH[value])
        if value == "foreign" and name == "samples":
            bad = str(world["root"] / "foreign" / "notes.jsonl")
        target = fill["evaluated"] if command == "compare" and name == "samples" else fill.get(name)
        argv = [bad if a == target else a for a in argv]
        assert bad in argv, case
        return argv
    if value == "under-a-file":
        return [*argv, flag, str(world["root"] / "a-file" / "out")]
    if value in BAD_PATH:
        bad = world["root"] / BAD_PATH[value]
        if value == "foreign" and flag == "--curve":
            bad = world["root"] / "foreign" / "notes.jsonl"
        return [*argv, flag, str(bad)]
    return [*argv, flag, value]


@pytest.fixture
def no_work(monkeypatch):
    """Any model forward or geometry computation fails the case: refusals come before work."""
    import geoprobe.geometry

    def work(*args, **kwargs):
        raise AssertionError("work started before the bad input was refused")

    monkeypatch.setattr(torch.nn.Module, "__call__", work)
    monkeypatch.setattr(geoprobe.geometry, "layer_geometry", work)


@pytest.mark.parametrize("command", sorted(BASE))
def test_every_bad_flag_and_file_is_one_line_and_exit_2(command, world, tmp_path, no_work):
    failures = []
    mine = [c for c in CASES if c[0] == command]
    for number, case in enumerate(mine):
        new = tmp_path / f"new-{number}"
        argv = argv_for(case, world, new)
        code, _, err = invoke(*argv)
        lines = [l for l in err.strip().splitlines() if l.strip()]
        if code != 2 or len(lines) != 1 or not lines[0].startswith("error: "):
            failures.append(f"{' '.join(case)} -> exit {code}: {err.strip()[:300]!r}")
        elif new.exists():
            failures.append(f"{' '.join(case)} -> refused but left files in --out")
    assert not failures, f"{len(failures)} of {len(mine)} cases not refused cleanly:\n" + "\n".join(failures)


def _has(command: str, flag: str) -> bool:
    return any(f == flag for f, *_ in parameters(commands()[command]))


def test_the_walk_covers_every_command_and_hundreds_of_cases():
    assert {c[0] for c in CASES} == set(BASE)
    assert len(CASES) >= 250, len(CASES)


@pytest.mark.parametrize("command", sorted(BASE))
def test_every_baseline_is_valid_so_each_refusal_is_the_bad_value(command, world, tmp_path, no_work):
    argv = argv_for((command, "--quiet-check", ""), world, tmp_path / "new")[:-2]  # the baseline alone
    code, _, err = invoke(*argv)
    assert code == 0 or (code == 1 and "work started before" in err), f"{argv}: exit {code}: {err}"


def test_help_lists_the_commands_in_the_order_a_user_runs_them():
    from geoprobe.cli.app import ORDER

    code, out, _ = invoke("--help")
    assert code == 0
    listed = [line.split()[1] for line in out.splitlines() if line.startswith("│ ") and len(line.split()) > 2
              and line.split()[1] in commands() | {"dsl": None, "baseline": None}]  # the groups
    assert listed == list(ORDER)


@pytest.mark.parametrize("command", ["bridge", "sweep"])
def test_bfloat16_weights_are_refused_where_only_a_small_bridge_trains(command, world, tmp_path, no_work):
    code, _, err = invoke(*argv_for((command, "--precision", "bfloat16"), world, tmp_path / "new"))
    assert code == 2 and err.strip() == "error: --precision bfloat16 is for dsl train; a bridge trains with auto or float32"
    assert not (tmp_path / "new").exists()


def test_the_global_options_work_after_the_command_too(scanned_run, tmp_path):
    """`geoprobe rank RUN --format json` is `geoprobe --format json rank RUN` (it was "No such
    option"); no command has an option of those names, so nothing else is taken for them."""
    import typer

    from geoprobe.cli.root import global_first

    run = copy_run(scanned_run, tmp_path / "run")
    code, out, err = invoke("rank", run, "--format", "json", "-q")
    assert code == 0, err
    assert json.loads(out)["ranking"]["chosen_layer"] in (0, 1, 2)
    assert global_first(["sample", "--model", "m", "--", "--format", "json"])[-2:] == ["--format", "json"]
    command = typer.main.get_command(app)
    root = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}

    def options(group):
        for sub in group.commands.values():
            yield from options(sub) if hasattr(sub, "commands") else (o for p in sub.params for o in p.opts)

    assert root == {"--debug", "--quiet", "-q", "--format"} and not root & set(options(command))
