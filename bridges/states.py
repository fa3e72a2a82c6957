"""Teacher states computed once per run, for every layer a run's bridges need.

Before, each bridge step re-ran the frozen prefix on its batch (43-67 % of a SmolLM2 step's
FLOPs), each evaluation re-forwarded the fixed stopping blocks, and every layer and seed
recomputed `ref_ce`. Here one pass of the frozen prefix, stopped after the deepest layer,
stores the states of layer 0 and of every requested layer for the training pool, the stopping
split and the validation split; every layer and seed trains and validates from them.

The states are kept in host RAM as float32 (the bits the on-the-fly teacher gives: tested), one
(tokens, d) tensor per layer and split; `plan` says how much room that takes and a run that
would not fit is refused in one line before the backbone runs. `ref_ce`, the frozen model's own
next-token loss on the validation blocks, is computed once here: it is the same for every layer.

On a GPU the states move onto it when they fit (`pool_on_device`, at most DEVICE_SHARE of its free
memory beside the loaded backbone): a step's batch is then one gather there, not a copy of each
row into host zeros, a pinned copy and an upload of the (B, L, d) batch per layer (the same
numbers: tested), and the host RAM they took is freed.

Under torchrun the ranks share one pass (`shared_teacher_states`): each forwards a contiguous
share of the batches one process forms, writes it to the run's directory, and reads the others'.
A rank keeps the layers it trains; `check_room` plans that per rank.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from geoprobe.backbone import load_config, parse_layers, resolve_source
from geoprobe.capture import capture
from geoprobe.device import upload
from geoprobe.distributed import World
from geoprobe.errors import BadInput
from geoprobe.events import note
from geoprobe.extract import pad_batch
from geoprobe.files import human, write_json_atomic
from geoprobe.memory import memory_available

HEADROOM = 0.6  # the share of the RAM available that the states may take (the backbone and training need the rest)
DEVICE_SHARE = 0.25  # the share of a GPU's free memory (the backbone loaded) the states may take there


@dataclass
class Split:
    """One split's blocks, flattened: block b's positions are ids[starts[b]:starts[b + 1]] and
    states[layer][starts[b]:starts[b + 1]] are their (float32) states; position 0 is the BOS."""

    blocks: list
    ids: torch.Tensor
    starts: torch.Tensor
    states: dict = field(default_factory=dict)
    pooled: bool = False  # the states live on the training device (`to_device`): batches are gathered there

    def __len__(self) -> int:
        return len(self.blocks)

    def to_device(self, device) -> None:
        """The states moved onto `device`; from then on a batch is gathered there."""
        self.states = {layer: table.to(device) for layer, table in self.states.items()}
        self.pooled = True

    def batch(self, indices: list[int], layers: tuple[int, ...], pad_id: int, device, length: int | None = None):
        """(ids, mask, {layer: (B, L, d) states}) for blocks `indices`, padded to `length` (default
        the longest of them) with zero states, on `device`."""
        chosen = [self.blocks[i] for i in indices]
        ids, mask = pad_batch(chosen, pad_id, device, length)
        if self.pooled:
            return ids, mask, self._gathered(indices, ids.shape[1], layers, device)
        states = {}
        for layer in layers:
            table = self.states[layer]
            out = torch.zeros(len(indices), ids.shape[1], table.shape[1], dtype=table.dtype)
            for row, i in enumerate(indices):
                start, end = int(self.starts[i]), int(self.starts[i + 1])
                out[row, :end - start] = table[start:end]
            states[layer] = upload(out, device)
        return ids, mask, states

    def _gathered(self, indices: list[int], length: int, layers: tuple[int, ...], device) -> dict:
        """{layer: (B, length, d)} from the pooled states: one index tensor uploaded (-1 past each
        block's end), one gather per layer on the device, zeros where the batch is padding."""
        offsets = torch.arange(length)
        lengths = self.starts[1:] - self.starts[:-1]
        chosen = torch.as_tensor(indices, dtype=torch.long)
        rows = torch.where(offsets < lengths[chosen][:, None], self.starts[chosen][:, None] + offsets, -1)
        rows = upload(rows, next(iter(self.states.values())).device)
        inside = (rows >= 0).unsqueeze(-1)
        gathered = {}
        for layer in layers:
            table = self.states[layer]
            gathered[layer] = upload(torch.where(inside, table[rows.clamp(min=0)], 0.0), device)
        return gathered

    def fixed(self, size: int, layers: tuple[int, ...], pad_id: int, device):
        """The whole split in order, `size` blocks at a time."""
        for start in range(0, len(self.blocks), size):
            yield self.batch(list(range(start, min(start + size, len(self.blocks)))), layers, pad_id, device)


@dataclass
class TeacherStates:
    """The states of a run's bridges: the training pool, the stopping and the validation split,
    the layers held, and the frozen model's next-token loss on the validation blocks."""

    train: Split
    stop: Split
    val: Split
    layers: tuple[int, ...]
    hidden_size: int
    ref_ce: float

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for s in (self.train, self.stop, self.val) for t in s.states.values())


def pool_on_device(states: TeacherStates, device: torch.device) -> bool:
    """Move every split's states onto a GPU `device` when they take at most DEVICE_SHARE of its
    free memory (said in one note otherwise); on the CPU they stay where they are. Whether they moved."""
    device = torch.device(device)
    if device.type == "cpu":
        return False
    free = memory_available(device)
    if states.nbytes > DEVICE_SHARE * free:
        note(f"note: the teacher states ({human(states.nbytes)}) stay in host RAM: over {DEVICE_SHARE:.0%} of the "
             f"{human(free)} free on {device}; each step uploads its batch")
        return False
    for split in (states.train, states.stop, states.val):
        split.to_device(device)
    return True


def plan_bytes(tokens: int, layers, hidden_size: int) -> int:
    """Host bytes of the states of `tokens` positions at `layers` (float32)."""
    return tokens * len(set(layers)) * hidden_size * 4


def check_room(tokens: int, layers, hidden_size: int, available: int | None = None, held=None) -> int:
    """The planned bytes of one process; refused in one line when those of every process on this
    host exceed HEADROOM of the RAM available. `held`: the layers one process keeps when the
    ranks split the layers among them (default: every one of `layers`). With several ranks the
    pass is shared (`shared_teacher_states`): a process forwards 1/WORLD_SIZE of the positions at
    every layer, then keeps the `held` layers of all of them."""

    held = set(layers) if held is None else set(held)
    ranks = max(int(os.environ.get("WORLD_SIZE", "1")), 1)
    need = max(plan_bytes(tokens, held, hidden_size), plan_bytes(-(-tokens // ranks), layers, hidden_size))
    available = memory_available(torch.device("cpu")) if available is None else available
    # every process on this host holds its own copy
    copies = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if copies * need > HEADROOM * available:
        each = f" in each of the {copies} processes on this host" if copies > 1 else ""
        if held == set(layers):
            what, advice = f"{len(set(layers))} layers", "a smaller --train-tokens or fewer --layers"
        else:
            what, advice = (f"{len(held)} of the {len(set(layers))} layers (those one rank trains)",
                            "a smaller --train-tokens, fewer --layers or more ranks")
        raise BadInput(f"the teacher states of {tokens:,} positions x {what} x d={hidden_size} need "
                       f"{human(need)} of RAM{each}, over {HEADROOM:.0%} of the {human(available)} available: pass "
                       f"{advice}")
    return need


def plan_room(model: str, layers, tokens: int, held=None) -> int:
    """check_room before any weight loads, as the scan's memory plan does: d and the layer count
    from the model's config alone, `layers` a --layers spec or a list (layer 0 is always cached),
    `tokens` an upper bound on the positions cached, `held` the layers one rank keeps when the
    ranks split them (None: all). Returns the planned bytes."""
    config = load_config(resolve_source(model))
    top = config.num_hidden_layers - 1  # a bridge needs a block above its layer
    # a list (the scanned layers) may hold the final state, which no bridge replaces; a layer out of
    # range in it is refused later, by the command's own check
    chosen = parse_layers(layers, top) if isinstance(layers, str) else [l for l in layers if l <= top]
    return check_room(tokens, {0, *chosen}, config.hidden_size, held=None if held is None else {0, *held})


def _flatten(blocks: list) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(b.tokens) for b in blocks], dtype=torch.long)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    ids = torch.cat([torch.as_tensor(b.tokens, dtype=torch.long) for b in blocks]) if blocks else \
        torch.zeros(0, dtype=torch.long)
    return ids, starts


@torch.no_grad()
def compute_split(backbone, blocks: list, layers, pad_id: int, batch_size: int, progress=None) -> Split:
    """The states of `blocks` at `layers`: the frozen prefix on `batch_size` blocks at a time,
    stopped after the deepest layer, each block's rows copied out without its padding."""

    layers = tuple(sorted(set(layers)))
    ids, starts = _flatten(blocks)
    split = Split(blocks, ids, starts, {l: torch.empty(len(ids), backbone.hidden_size) for l in layers})
    for first in range(0, len(blocks), batch_size):
        chosen = blocks[first:first + batch_size]
        batch_ids, mask = pad_batch(chosen, pad_id, backbone.input_device)
        got = capture(backbone, batch_ids, mask, layers=layers)
        for layer in layers:
            states = got[layer].float().cpu()
            for row, block in enumerate(chosen):
                start = int(starts[first + row])
                split.states[layer][start:start + len(block.tokens)] = states[row, :len(block.tokens)]
        if progress is not None:
            progress.advance(len(chosen))
    return split


@torch.no_grad()
def reference_sums(backbone, split: Split, pad_id: int, batch_size: int) -> list[tuple[float, float]]:
    """Per batch of `split` (`batch_size` blocks at a time), the frozen model's summed next-token
    cross-entropy and the positions it sums over (position i predicts i + 1, from the layer-0
    states through every block and the head)."""
    sums = []
    for ids, mask, states in split.fixed(batch_size, (0,), pad_id, backbone.input_device):
        final = backbone.final_from(0, states[0], attention_mask=mask)[:, :-1]
        ce = backbone.token_losses(final, ids[:, 1:])
        pair = mask[:, 1:].float()
        sums.append((float((ce * pair).sum()), float(pair.sum())))
    return sums


def mean_of(sums: list[tuple[float, float]]) -> float:
    """The loss per position from `reference_sums`' batches, added in their order."""
    total, count = 0.0, 0.0
    for batch_total, batch_count in sums:
        total += batch_total
        count += batch_count
    return total / max(count, 1.0)


def reference_ce(backbone, split: Split, pad_id: int, batch_size: int) -> float:
    """The frozen model's next-token cross-entropy on `split`: the `ref_ce` of every bridge."""
    return mean_of(reference_sums(backbone, split, pad_id, batch_size))


def teacher_states(backbone, train_blocks: list, stop_blocks: list, val_blocks: list, layers, batch_size: int = 8,
                   progress=None) -> TeacherStates:
    """One pass of the frozen prefix over the three splits at layer 0 and `layers` (checked
    against the RAM first), and the reference loss on the validation split."""
    layers = tuple(sorted({0, *layers}))
    tokens = sum(len(b.tokens) for b in (*train_blocks, *stop_blocks, *val_blocks))
    check_room(tokens, layers, backbone.hidden_size)
    pad_id = backbone.tokenizer.pad_token_id if backbone.tokenizer.pad_token_id is not None else 0
    if progress is not None:
        progress.start(total=len(train_blocks) + len(stop_blocks) + len(val_blocks))
    splits = [compute_split(backbone, blocks, layers, pad_id, batch_size, progress)
              for blocks in (train_blocks, stop_blocks, val_blocks)]
    return TeacherStates(*splits, layers, backbone.hidden_size, reference_ce(backbone, splits[2], pad_id, batch_size))


def _batch_ranges(counts: list[int], batch_size: int, world: World) -> list[tuple[int, int]]:
    """This rank's blocks [lo, hi) of each split: a contiguous share of the batches one process
    forms (`batch_size` blocks from each split's start; the shares differ by at most one batch)."""
    batches = [-(-n // batch_size) for n in counts]
    lo, hi = world.share(sum(batches))
    ranges, first = [], 0
    for n, count in zip(counts, batches):
        start, stop = (min(max(edge - first, 0), count) for edge in (lo, hi))
        ranges.append((min(start * batch_size, n), min(stop * batch_size, n)))
        first += count
    return ranges


def _forward_part(backbone, splits: list[list], layers: tuple, path: Path, world: World, batch_size: int,
                  progress=None) -> None:
    """This rank's share of the pass (`_batch_ranges`) at every layer, and the reference loss's sums
    on its validation batches, written whole to `path` (a reader never sees half a file)."""
    pad_id = backbone.tokenizer.pad_token_id if backbone.tokenizer.pad_token_id is not None else 0
    ranges = _batch_ranges([len(blocks) for blocks in splits], batch_size, world)
    if progress is not None:
        progress.start(total=sum(hi - lo for lo, hi in ranges))
    parts = [compute_split(backbone, blocks[lo:hi], layers, pad_id, batch_size, progress)
             for blocks, (lo, hi) in zip(splits, ranges)]
    part = {"rank": world.rank, "ranges": ranges, "forwarded": sum(len(p) for p in parts),
            "states": [p.states for p in parts], "ref": reference_sums(backbone, parts[2], pad_id, batch_size)}
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(part, tmp)
    os.replace(tmp, path)


def _assembled(splits: list[list], keep: tuple, folder: Path, world: World, hidden_size: int):
    """(the three Splits at the `keep` layers, the reference loss's batch sums in order, each rank's
    record) from every rank's part in `folder`, read in rank order (the batches' order)."""
    whole = []
    for blocks in splits:
        ids, starts = _flatten(blocks)
        whole.append(Split(blocks, ids, starts, {l: torch.empty(len(ids), hidden_size) for l in keep}))
    sums, record = [], []
    for rank in range(world.size):
        part = torch.load(folder / f"part-{rank}.pt", mmap=True, weights_only=True)
        for split, (lo, hi), states in zip(whole, part["ranges"], part["states"]):
            start, stop = int(split.starts[lo]), int(split.starts[hi])
            for layer in keep:
                split.states[layer][start:stop] = states[layer]
        sums += part["ref"]
        record.append({"rank": rank, "ranges": [list(r) for r in part["ranges"]], "forwarded": part["forwarded"]})
    return whole, sums, record


def shared_teacher_states(backbone, train_blocks: list, stop_blocks: list, val_blocks: list, layers, *,
                          folder: Path, world: World, keep=None, batch_size: int = 8, progress=None) -> TeacherStates:
    """`teacher_states` with the pass split over the ranks of `world`: each rank forwards a
    contiguous share of the batches one process forms (so the same bits) at layer 0 and every
    one of `layers`, writes it to folder/part-R.pt, and every rank then reads every part, keeping
    layer 0 and `keep` (default: every layer). The parts are deleted once read; folder/pass.json
    records the blocks each rank forwarded (each block once in all). On CPU ranks the matrix products
    run on each rank's own threads (torchrun gives each one), and a product's bits can depend on the
    thread count, so they are the one-process bits where the thread counts agree."""
    layers = tuple(sorted({0, *layers}))
    keep = layers if keep is None else tuple(sorted({0, *keep}))
    splits = [train_blocks, stop_blocks, val_blocks]
    check_room(sum(len(b.tokens) for blocks in splits for b in blocks), layers, backbone.hidden_size, held=keep)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        world.together(lambda: _forward_part(backbone, splits, layers, folder / f"part-{world.rank}.pt", world,
                                             batch_size, progress))
        whole, sums, record = world.together(lambda: _assembled(splits, keep, folder, world, backbone.hidden_size))
        world.barrier()  # every rank has read every part
    except BaseException:  # failed on some rank: the parts (every layer's states) do not stay on the disk
        (folder / f"part-{world.rank}.pt").unlink(missing_ok=True)
        raise
    if world.is_main:
        for rank in range(world.size):
            (folder / f"part-{rank}.pt").unlink(missing_ok=True)
        write_json_atomic(folder / "pass.json", {"world_size": world.size, "layers": list(layers),
                                                 "blocks": [len(blocks) for blocks in splits], "ranks": record})
    return TeacherStates(*whole, keep, backbone.hidden_size, mean_of(sums))
