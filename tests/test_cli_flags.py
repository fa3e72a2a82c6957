"""Each settings flag is declared once: `bridge` and `sweep` share their BridgeSettings options,
their defaults are the dataclasses', and a choice reaches the library as its plain string."""

from __future__ import annotations

import inspect

from geoprobe.cli import bridge as bridge_cli, sample as sample_cli
from geoprobe.cli.app import app  # noqa: F401  (registers every command)
from geoprobe.workflows.generate import SampleSettings, set_name
from geoprobe.workflows.sweep import NETWORK, BridgeSettings, bridge_settings
from tests.helpers import invoke


def _parameters(command) -> dict:
    return inspect.signature(command).parameters


def test_bridge_and_sweep_take_the_same_declaration_of_each_settings_flag():
    bridge, sweep = _parameters(bridge_cli.bridge), _parameters(bridge_cli.sweep)
    for name, declared in bridge_cli.SETTINGS.items():
        assert bridge[name].annotation is declared and sweep[name].annotation is declared, name
        assert bridge[name].default == sweep[name].default
    defaults = BridgeSettings(NETWORK)
    assert bridge["steps"].default == defaults.steps and bridge["d_model"].default == NETWORK.d_model
    assert bridge["attention"].default == NETWORK.attention and bridge["regression"].default is False
    assert "settings" not in bridge and "settings" not in sweep  # made from the flags, never a flag itself


def test_bridge_and_sweep_hand_the_library_the_same_settings_with_plain_choices(monkeypatch, tmp_path):
    seen = {}

    def fake_bridge_run(settings, *args, **placement):
        seen["bridge"] = settings
        return None, tmp_path  # as a data-parallel rank other than 0: nothing to report

    def fake_sweep_run(run, settings, *args, **placement):
        seen["sweep"] = settings

    monkeypatch.setattr(bridge_cli, "bridge_run", fake_bridge_run)
    monkeypatch.setattr(bridge_cli, "sweep_run", fake_sweep_run)
    flags = ["--attention", "causal", "--vocab", "all", "--until", "steps", "--precision", "float32", "--steps", "7",
             "--regression"]
    assert invoke("bridge", "--run", tmp_path, *flags)[0] == 0
    assert invoke("sweep", "--run", tmp_path, *flags)[0] == 0
    expected = bridge_settings(attention="causal", vocab="all", until="steps", precision="float32", steps=7,
                               regression=True)
    assert seen["bridge"] == seen["sweep"] == expected
    assert expected.network.sigma_b == 0 and expected.network.bridge_steps == 1  # --regression's settings
    for value in (seen["bridge"].network.attention, seen["bridge"].network.precision, seen["bridge"].until):
        assert type(value) is str


def test_sample_builds_its_settings_from_its_flags_and_names_the_set_by_plain_values(monkeypatch, tmp_path):
    seen = {}

    def fake_generate(model, sampler, settings, out, **placement):
        seen["settings"] = settings
        return {"meta": {"file": str(tmp_path / "samples.jsonl")}, "samples": []}

    monkeypatch.setattr(sample_cli, "generate", fake_generate)
    code, _, err = invoke("-q", "sample", "--model", tmp_path, "--decode", "round", "--finisher", "remdm-loop",
                          "--steps", "12", "--no-final-argmax")
    assert code == 0, err
    settings = seen["settings"]
    assert settings == SampleSettings(decode="round", finisher="remdm-loop", steps=12, final_argmax=False)
    assert set_name("hybrid", settings) == "hybrid-steps-12-no-final-argmax-finisher-remdm-loop-decode-round"
    code, _, err = invoke("sample", "--model", tmp_path, "--decode", "nearest")
    assert code == 2 and err.count("\n") == 1 and "'nearest' is not one of 'stack', 'stack-only', 'round'" in err
