"""What the tests share besides fixtures: the two ways to run the CLI (a fresh process, as a
user would, and in this process, which is faster), the one-line-error check, tiny random models
of every supported architecture, the test tokenizer, synthetic corpora, and small run helpers.

The fixtures built from these live in conftest.py."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import torch

from geoprobe.fixtures import VOCAB, WORDS, build_tokenizer, synthetic_text, write_corpus  # noqa: F401 (shared with bench)


TINY = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=512)
ARCH_CONFIGS = {
    "llama": ("LlamaConfig", TINY),
    "qwen2": ("Qwen2Config", TINY),
    "qwen3": ("Qwen3Config", {**TINY, "head_dim": 16}),
    "mistral": ("MistralConfig", TINY),
    "gemma2": ("Gemma2Config", {**TINY, "head_dim": 16, "sliding_window": 8}),
    "gemma3_text": ("Gemma3TextConfig", {**TINY, "head_dim": 16, "sliding_window": 8}),
    "gpt2": ("GPT2Config", dict(n_embd=64, n_layer=3, n_head=4, vocab_size=VOCAB, n_positions=512)),
    "phi3": ("Phi3Config", {**TINY, "pad_token_id": 0}),
}

# The settings of the one scanned run the tests share (the `scanned_run` fixture): the tiny Llama
# on the test corpus. A test that re-extracts that run passes the same extraction flags.
SCAN = dict(tokens=400, seq_len=32, anchors=64, k=8, pairs=256, bootstrap=20, device="cpu")


# The one real-model scan of the session (the `smollm2_scan` fixture): SmolLM2 on ~4,000 KJV tokens,
# all 31 layers (the default 8 redraws of the estimator are tested elsewhere: 2 here), a quarter
# of the default anchors and pairs (what its tests check, real massive activations, layer 0's
# duplicates, both rankings, P(first), does not need more; the geometry is most of its time)
REAL_SCAN = ["scan", "builtin:smollm2", "--corpus", "kjv", "--tokens", "4000", "--device", "cpu", "--reseeds", "2",
             "--anchors", "512", "--pairs", "1024"]


def flags(settings: dict) -> list[str]:
    """{"seq_len": 32} -> ["--seq-len", "32"]."""
    return [item for name, value in settings.items() for item in ("--" + name.replace("_", "-"), str(value))]


# --- running the CLI ------------------------------------------------------------------------------

# one thread per process: two processes (a killed run and its uninterrupted reference, two ranks)
# share a 2-core machine side by side, and equal thread counts give equal bits
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def run_cli(*args, env=None, timeout=600, background=False):
    """Run `python -m geoprobe ARGS` in a fresh process, as a user would: the finished process
    (a CompletedProcess), or with background=True the running one (a Popen, stderr piped, for a
    test that kills it)."""
    argv = [sys.executable, "-m", "geoprobe", *map(str, args)]
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    if background:
        return subprocess.Popen(argv, env=full_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, preexec_fn=as_a_terminal_would)
    return subprocess.run(argv, capture_output=True, text=True, env=full_env, timeout=timeout,
                          stdin=subprocess.DEVNULL, preexec_fn=as_a_terminal_would)


def as_a_terminal_would() -> None:
    """Ctrl-C's default disposition in the child, as a terminal's foreground job has it: a test
    run started with `&` by a non-interactive shell ignores SIGINT, an ignored signal stays
    ignored across exec, and Python then installs no KeyboardInterrupt handler, so the CLI would
    never see the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def invoke(*args) -> tuple[int, str, str]:
    """Run `geoprobe ARGS` in this process through the CLI's entry point (the Typer app and its
    error handling, exactly what `python -m geoprobe` runs); returns (exit code, stdout, stderr)."""
    from geoprobe.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
    return code, out.getvalue(), err.getvalue()


def assert_one_line_error(code, err, expected_code, fragment):
    assert code == expected_code, err
    lines = [l for l in err.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0], lines[0]


# --- tiny models, a tokenizer, corpora --------------------------------------------------------------


def build_model(arch: str, folder: Path, seed: int = 0, scale_embeddings: float = 1.0):
    import transformers

    class_name, kwargs = ARCH_CONFIGS[arch]
    config = getattr(transformers, class_name)(**kwargs)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    if scale_embeddings != 1.0:
        with torch.no_grad():
            model.get_input_embeddings().weight.mul_(scale_embeddings)
    model.save_pretrained(folder)
    build_tokenizer(folder)
    return folder


# --- run directories ----------------------------------------------------------------------------------


def read_json(path: Path):
    return json.loads(Path(path).read_text())


def all_rows(run):
    """Every row of a run (all shards, in order) as one pyarrow table."""
    import pyarrow.parquet as pq

    return pq.read_table(sorted((Path(run) / "hidden").glob("part-*.parquet")))


def copy_run(run: Path, dest: Path) -> Path:
    """A copy of a finished run that a test may change."""
    return Path(shutil.copytree(run, dest))


def interrupted_copy(run: Path, dest: Path, keep_shards: int) -> Path:
    """A copy of a finished run as an interruption leaves it: the first `keep_shards` shards
    listed, the later ones gone, a half-written temporary, status running."""
    copy = copy_run(run, dest)
    manifest = read_json(copy / "manifest.json")
    for shard in manifest["shards"][keep_shards:]:
        (copy / shard["file"]).unlink()
    manifest["shards"] = manifest["shards"][:keep_shards]
    manifest["status"] = "running"
    (copy / "manifest.json").write_text(json.dumps(manifest))
    (copy / "hidden" / f".part-{keep_shards:05d}.parquet.tmp").write_bytes(b"half a shard")
    return copy
