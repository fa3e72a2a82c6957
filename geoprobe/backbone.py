"""Load any supported Hugging Face causal LM and give generic access to its residual stream.

`Backbone` finds the blocks, the final norm and the LM head from the module tree (the one
`nn.ModuleList` of `num_hidden_layers` blocks under `base_model`, the last norm after it,
`get_output_embeddings()`), so no per-architecture code is needed:

* `embed(input_ids)` is what the first block receives, by running the model up to a hook on
  block 1 (so Gemma's sqrt(d) scaling and GPT-2's position embeddings are included);
* `run_from(l, h)` runs blocks l+1..N, the final norm and the head on a given layer-l state by
  making blocks 1..l pass their input through and substituting `h` at the entry of block l+1.
  The model's own forward still builds masks, rotary tables and any logit soft-capping.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from geoprobe.assets import builtin_model
from geoprobe.capture import capture, stream_arg
from geoprobe.device import deterministic_cuda
from geoprobe.errors import BadInput, GeoprobeError
from geoprobe.files import sha256_file
from geoprobe.memory import load_dtype

SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "gpt2", "phi3")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
BUILTIN_PREFIX = "builtin:"


def resolve_device(spec: str = "auto") -> torch.device:
    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise BadInput(f"unknown device {spec!r}: use auto, cpu, cuda or cuda:N") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BadInput(f"device {spec!r} asked for, but CUDA is not available on this machine")
    if device.type == "cuda":
        deterministic_cuda()
    return device


DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's placement strategies


def check_device_map(device_map: str | None) -> None:
    if device_map is not None and device_map not in DEVICE_MAPS:
        raise BadInput(f"unknown --device-map {device_map!r} (use {', '.join(DEVICE_MAPS)})")


def resolve_dtype(spec: str, device: torch.device, checkpoint_dtype) -> torch.dtype:
    """auto = the checkpoint's dtype on a GPU, float32 on the CPU (half matmuls are slow there)."""
    if spec == "auto":
        if device.type == "cpu" or checkpoint_dtype is None:
            return torch.float32
        return checkpoint_dtype if isinstance(checkpoint_dtype, torch.dtype) else DTYPES.get(str(checkpoint_dtype), torch.float32)
    if spec not in DTYPES:
        raise BadInput(f"unknown dtype {spec!r}: use auto, float32, bfloat16 or float16")
    return DTYPES[spec]


def parse_layers(spec: str, num_layers: int) -> list[int]:
    """`all`, `0-8`, `0,3,7` or a mix (`0-3,7`) -> sorted layer list within 0..num_layers."""
    if spec.strip() == "all":
        return list(range(num_layers + 1))
    layers: set[int] = set()
    try:
        for part in spec.split(","):
            lo, sep, hi = part.strip().partition("-")
            start, stop = int(lo), int(hi) if sep else int(lo)
            if start > stop:
                raise ValueError
            layers.update(range(start, stop + 1))
    except ValueError:
        raise BadInput(f"malformed layer spec {spec!r}: use all, 0-8, 0,3,7 or a mix like 0-3,7") from None
    outside = sorted(l for l in layers if not 0 <= l <= num_layers)
    if outside:
        raise BadInput(f"layer {outside[0]} out of range: this model has layers 0..{num_layers}")
    return sorted(layers)


def config_hash(config) -> str:
    """Hash of the architecture-defining config (paths and library versions left out)."""
    data = {k: v for k, v in config.to_dict().items()
            if k not in {"_name_or_path", "transformers_version", "_commit_hash", "dtype", "torch_dtype",
                         "quantization_config"}}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def find_blocks(model) -> torch.nn.ModuleList:
    """A causal LM's decoder blocks: the one ModuleList of num_hidden_layers under its base model."""
    n = model.config.num_hidden_layers
    for module in model.base_model.children():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return module
    raise GeoprobeError(f"cannot find the {n} decoder blocks of {type(model).__name__}")


@dataclass(frozen=True)
class ModelSource:
    """Where weights come from: what `from_pretrained` is called with."""

    spec: str
    location: str
    gguf_file: str | None = None
    is_local: bool = True
    extra_identity: dict = field(default_factory=dict)


def check_gguf(path: Path) -> None:
    """A .gguf file's magic, header and tensor extents, read without loading the weights: a
    truncated or corrupt file is one line naming it instead of a struct error deep in a loader."""
    with open(path, "rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise BadInput(f"{path} is not a GGUF file (its first bytes are {magic!r}, not b'GGUF')")
    try:
        from gguf import GGUFReader

        tensors = GGUFReader(path).tensors
    except Exception as exc:  # the reader fails in many ways on a cut-off header or tensor table
        raise BadInput(f"{path} is truncated or corrupt: it cannot be read as GGUF ({exc})") from None
    end = max((t.data_offset + t.n_bytes for t in tensors), default=0)
    if end > path.stat().st_size:
        raise BadInput(f"{path} is truncated: its tensors need {end:,} bytes, the file has {path.stat().st_size:,}")


def model_file_sha256(path: Path) -> str:
    """A model file's SHA-256, hashed once per process while the file's stat (inode, size, mtime,
    ctime) stays the same: a command resolves its model more than once (the room plan before the load, then the
    load), and an 8B .gguf takes seconds to hash. Shards are verified by sha256_file, uncached."""
    stat = path.stat()  # a rewrite changes the inode's ctime even within one mtime tick
    return _file_sha256(str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


@functools.lru_cache(maxsize=8)
def _file_sha256(path: str, *stat_key) -> str:  # the file's stat is the cache key
    return sha256_file(Path(path))


def resolve_source(spec: str) -> ModelSource:
    if spec.startswith(BUILTIN_PREFIX):

        folder, identity = builtin_model(spec[len(BUILTIN_PREFIX):])
        return ModelSource(spec, str(folder), extra_identity=identity)
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise BadInput(f"model file not found: {spec}")
        check_gguf(path)
        return ModelSource(spec, str(path.parent), gguf_file=path.name,
                           extra_identity={"file_sha256": model_file_sha256(path)})
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise BadInput(f"model folder {spec} has no config.json")
        return ModelSource(spec, str(path))
    if spec.startswith((".", "/", "~")) or os.sep + os.sep in spec or spec.count("/") > 1:
        raise BadInput(f"model path not found: {spec}")
    return ModelSource(spec, spec, is_local=False)


def check_bridge_layer(layer: int, blocks: int) -> None:
    """One line where a bridge cannot sit at `layer` of a model of `blocks` blocks: it replaces
    the model below the layer and keeps at least one block above it, so layers 0..blocks - 1."""
    if 0 <= layer < blocks:
        return
    where = ("the last block's output" if layer == blocks else f"past the model's {blocks} blocks" if layer > blocks
             else "not a layer")
    raise BadInput(f"--layer {layer} out of range: use 0..{blocks - 1} (layer {layer} is {where}, and a bridge needs "
                   "a block above its layer)")


def hub_offline() -> bool:
    """Whether the Hugging Face hub is off limits (HF_HUB_OFFLINE set): the one place that asks."""
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")


def load_config(source: ModelSource, trust_remote_code: bool = False):
    from transformers import AutoConfig

    offline = hub_offline()
    try:
        return AutoConfig.from_pretrained(source.location, gguf_file=source.gguf_file,
                                          trust_remote_code=trust_remote_code,
                                          local_files_only=offline and not source.is_local)
    except (OSError, ValueError) as exc:
        if not source.is_local and offline:
            raise BadInput(f"model {source.spec!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1; "
                           "download it first or pass a local folder or .gguf file") from exc
        if not source.is_local:
            raise BadInput(f"model {source.spec!r} not found on the hub or in the cache ({type(exc).__name__})") from exc
        raise BadInput(f"cannot read the model config at {source.spec}: {str(exc).splitlines()[0]}") from exc


def check_architecture(config) -> None:
    if config.model_type not in SUPPORTED_ARCHITECTURES:
        raise BadInput(f"unsupported architecture {config.model_type!r} "
                       f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})")


class Backbone:
    """A frozen causal LM with generic access to embeddings, blocks, final norm and head."""

    def __init__(self, model, tokenizer=None, identity: dict | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.config = model.config
        check_architecture(self.config)
        self.identity = identity or {}
        self.base = model.base_model
        self.blocks = self._find_blocks()
        self.final_norm = self._find_final_norm()
        self.lm_head = model.get_output_embeddings()

    def _find_blocks(self):
        return find_blocks(self.model)

    def _find_final_norm(self):
        children = list(self.base.children())
        after_blocks = children[children.index(self.blocks) + 1:]
        norms = [m for m in after_blocks if "norm" in type(m).__name__.lower()]
        if not norms:
            raise GeoprobeError(f"cannot find the final norm of {type(self.model).__name__}")
        return norms[0]

    @property
    def num_layers(self) -> int:
        """N: layers are numbered 0 (embedding output) .. N (after the last block)."""
        return len(self.blocks)

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def input_device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    def embed(self, input_ids, attention_mask=None, position_ids=None) -> torch.Tensor:
        """Layer 0: exactly what block 1 receives for these tokens."""
        return capture(self, input_ids, attention_mask, layers=(0,), position_ids=position_ids)[0]

    @contextmanager
    def _entering_at(self, layer: int, hidden: torch.Tensor):
        """Blocks 1..layer pass their input through; the stream entering block layer+1
        (or the final norm when layer = N) is replaced by `hidden`."""
        entry = self.blocks[layer] if layer < self.num_layers else self.final_norm

        def substitute(module, args, kwargs):
            current = stream_arg(args, kwargs)
            new = hidden.to(device=current.device, dtype=current.dtype)
            if args:
                return (new, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": new}

        skipped = list(self.blocks)[:layer]
        saved = [block.__dict__.get("forward") for block in skipped]  # accelerate may wrap forward
        for block in skipped:
            block.forward = _pass_through
        handle = entry.register_forward_pre_hook(substitute, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()
            for block, old in zip(skipped, saved):
                if old is None:
                    del block.forward
                else:
                    block.forward = old

    def run_from(self, layer: int, hidden, attention_mask=None, position_ids=None, cache=None) -> torch.Tensor:
        """Logits of blocks layer+1..N, the final norm and the head applied to a layer-`layer` state.
        With a `cache` (`upper_cache`), `hidden` holds the positions after those the cache has
        read, and blocks layer+1..N keep their keys and values in it: left-to-right decoding
        reads each position once."""
        return self._spliced(self.model, layer, hidden, attention_mask=attention_mask, position_ids=position_ids,
                             cache=cache).logits

    def upper_cache(self):
        """An empty key-value cache for `run_from`."""
        from transformers import DynamicCache

        return DynamicCache(config=self.config)

    def final_from(self, layer: int, hidden, attention_mask=None) -> torch.Tensor:
        """What `run_from` feeds the head: the final-normed states of blocks layer+1..N."""
        return self._spliced(self.base, layer, hidden, attention_mask=attention_mask).last_hidden_state

    def _spliced(self, module, layer: int, hidden, **kwargs):
        """`module` (the model, or its base without the head) run with `hidden` entering after block `layer`."""
        if not 0 <= layer <= self.num_layers:
            raise BadInput(f"layer {layer} out of range 0..{self.num_layers}")
        placeholder = torch.zeros(hidden.shape[:2], dtype=torch.long, device=self.input_device)
        cache = kwargs.pop("cache", None)
        with self._entering_at(layer, hidden):
            out = module(input_ids=placeholder, use_cache=cache is not None, cache=cache, **kwargs)
        if cache is not None:
            # blocks 1..layer pass their input through and keep nothing; their layers of the cache
            # get as many positions (of one zero channel), since the model reads the positions seen from the first
            for skipped in range(layer):
                blank = hidden.new_zeros(hidden.shape[0], 1, hidden.shape[1], 1)
                cache.update(blank, blank, skipped)
        return out

    def head(self, final: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) in the head's dtype of final-normed states (..., d), as `run_from` computes
        them (Gemma's soft-capping included): a caller that needs a few positions' logits runs
        `final_from` and then the head on those positions only."""
        return self.softcap(self.lm_head(final))

    def softcap(self, logits: torch.Tensor) -> torch.Tensor:
        """Gemma's final logit soft-capping, cap * tanh(logits / cap), which its model applies after
        the head; the logits unchanged for a model without it."""
        cap = getattr(self.config, "final_logit_softcapping", None)
        return torch.tanh(logits / cap) * cap if cap else logits

    def token_losses(self, final: torch.Tensor, targets: torch.Tensor, chunk: int = 2048) -> torch.Tensor:
        """-log p(target) in float32 for final-normed states (..., d) and target ids (...), the head
        run on `chunk` positions at a time: never a positions x V float32 tensor (10 GB at 8,192
        positions of a 128k vocabulary), at most chunk x V. Gemma's final logit soft-capping,
        which its model applies after the head, is applied here too."""
        flat, ids = final.reshape(-1, final.shape[-1]), targets.reshape(-1)
        losses = torch.empty(len(ids), dtype=torch.float32, device=final.device)
        for start in range(0, len(ids), chunk):
            logits = self.softcap(self.lm_head(flat[start:start + chunk]).float())
            losses[start:start + chunk] = F.cross_entropy(logits, ids[start:start + chunk], reduction="none")
        return losses.view(targets.shape)


def _pass_through(*args, **kwargs):
    return stream_arg(args, kwargs)


def load_tokenizer(spec: str, trust_remote_code: bool = False):
    """The tokenizer of a model spec alone (no weights loaded)."""
    from transformers import AutoTokenizer

    source = resolve_source(spec)
    offline = hub_offline()
    try:
        return AutoTokenizer.from_pretrained(source.location, gguf_file=source.gguf_file,
                                             trust_remote_code=trust_remote_code,
                                             local_files_only=offline and not source.is_local)
    except (OSError, ValueError, TypeError) as exc:
        raise BadInput(f"model {spec!r} has no usable tokenizer ({str(exc).splitlines()[0][:120]})") from exc


def hub_cache() -> Path:
    """The local Hugging Face hub cache (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    return Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")) / "hub"


def locate_backbone(spec: str, config_sha256: str, record: str) -> str:
    """Where the backbone a record names is now: `spec` as the record stores it (as given when it
    was trained) when it still loads with that architecture's config hash, else the first model
    of that hash in the local Hugging Face cache (a moved folder that was also downloaded), else
    one line saying where it looked. `record`: the trained model's folder, for the message."""
    from transformers import AutoConfig

    try:
        if config_hash(load_config(resolve_source(spec))) == config_sha256:
            return spec
        why = "it has another architecture now"
    except BadInput as exc:
        why = str(exc)
    looked = sorted(hub_cache().glob("models--*/snapshots/*/config.json"))
    for path in looked:
        try:
            if config_hash(AutoConfig.from_pretrained(path.parent, local_files_only=True)) == config_sha256:
                return str(path.parent)
        except (OSError, ValueError):
            continue
    raise BadInput(f"{record} was trained on {spec} (config sha256 {config_sha256[:12]}…), not found: not as given "
                   f"({why}), nor among the {len(looked)} models of the Hugging Face cache {hub_cache()}; "
                   f"put the model back at {spec} or into that cache")


@contextmanager
def no_library_bars():
    """transformers' own progress bars off while it loads weights, as they were after: the
    library's one message path is geoprobe.events (a notebook calling geoprobe.scan sees no
    "Loading weights" bar between its own lines)."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def load_backbone(spec: str, *, dtype: str = "auto", device: str = "auto", device_map: str | None = None,
                  trust_remote_code: bool = False, revision: str | None = None,
                  batch: tuple[int, int] = (8, 512)) -> Backbone:
    """Load a causal LM from a hub id, a local folder, a .gguf file or `builtin:NAME`; `batch`
    (sequences, tokens each): the forward batch that must fit beside the weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_device_map(device_map)
    source = resolve_source(spec)
    config = load_config(source, trust_remote_code)
    check_architecture(config)
    target = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, target, getattr(config, "dtype", None))
    if device_map is None:  # checked before any weight is read, on the CPU and on one GPU alike
        torch_dtype = load_dtype(config, torch_dtype, dtype, target, *batch)
    offline = hub_offline()
    kwargs = dict(gguf_file=source.gguf_file, trust_remote_code=trust_remote_code, revision=revision,
                  local_files_only=offline and not source.is_local)
    try:
        with no_library_bars():
            model = AutoModelForCausalLM.from_pretrained(source.location, dtype=torch_dtype,
                                                         device_map=device_map, **kwargs)
    except OSError as exc:
        raise BadInput(f"cannot load model {spec!r}: {str(exc).splitlines()[0]}") from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(source.location, **kwargs)
    except (OSError, ValueError, TypeError) as exc:
        raise BadInput(f"model {spec!r} has no usable tokenizer ({str(exc).splitlines()[0][:120]})") from exc
    if device_map is None:
        model.to(target)
    model.requires_grad_(False)
    identity = {
        "spec": spec,
        "architecture": config.model_type,
        "revision": revision or getattr(config, "_commit_hash", None),
        "config_sha256": config_hash(config),
        "num_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "dtype": str(torch_dtype).removeprefix("torch."),
        **source.extra_identity,
    }
    return Backbone(model, tokenizer, identity)
