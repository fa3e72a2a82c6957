"""Shared fixtures: tiny random models of every supported architecture with the test tokenizer,
a small corpus, the tiny Llama loaded once, one scanned run of it, the testbed, and (once per
session) the real SmolLM2 backbone and one real scan. The functions they are built from, and
the CLI runners, are in tests/helpers.py."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path

import pytest

from tests.helpers import REAL_SCAN, SCAN, build_model, flags, invoke, write_corpus


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """arch -> folder holding a tiny random model and the test tokenizer (built lazily)."""
    root = tmp_path_factory.mktemp("models")
    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            built[arch] = build_model(arch, root / arch)
        return built[arch]

    return get


@pytest.fixture(scope="session")
def corpus_txt(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "docs.txt", n_docs=40)


@pytest.fixture(scope="session")
def llama(tiny_models):
    """The tiny Llama as a backbone (float32 on the CPU), loaded once. Tests must leave it as they found it."""
    from geoprobe.backbone import load_backbone

    return load_backbone(str(tiny_models("llama")), device="cpu")


@pytest.fixture(scope="session")
def scanned_run(tmp_path_factory, tiny_models, corpus_txt) -> Path:
    """`geoprobe scan` of the tiny Llama on the test corpus with the SCAN settings, once per session.
    Read it, never write it: a test or module that writes into a run works on a copy (helpers.copy_run)."""
    run = tmp_path_factory.mktemp("scanned") / "run"
    code, _, err = invoke("-q", "scan", tiny_models("llama"), "--corpus", corpus_txt, *flags(SCAN), "--out", run)
    assert code == 0, err
    return run


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct backbone, loaded once per test session."""
    from geoprobe.backbone import load_backbone

    return load_backbone("builtin:smollm2", device="cpu")


@pytest.fixture(scope="session")
def smollm2_scan(tmp_path_factory) -> Path:
    """`geoprobe scan` of SmolLM2 on the KJV (REAL_SCAN), once per session; the model loads from the
    cached folder. Read it, never write it: copy it first (helpers.copy_run)."""
    run = tmp_path_factory.mktemp("real") / "scan"
    code, _, err = invoke(*REAL_SCAN, "--out", run)
    assert code == 0, err
    return run


@pytest.fixture(scope="session")
def testbed():
    """builtin:hmm-tiny: (folder, its build record), trained once per cache (a few minutes the first time)."""
    from geoprobe.assets import builtin_model

    return builtin_model("hmm-tiny")
