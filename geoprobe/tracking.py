"""Experiment tracking (`--log-to tensorboard`, as Hugging Face Trainer's `report_to`): a
training run's scalars written as TensorBoard event files in `tensorboard/` under the trained
model's directory. The training loop (bridges/train.py) writes the training loss, the learning
rate, steps/s and tokens/s in steps of LOG_EVERY, and each validation score of the plateau rule.
The terminal's progress bar stays as it is.

A training command's library call sets where its runs log (`tracking`, a context around the
training); the loop opens the writer itself (rank 0 only). The writer is tensorboardX's (90 kB
and protobuf; `tensorboard` itself, which torch.utils.tensorboard needs, is 5.5 MB with a web
server's dependencies); `tensorboard --logdir DIR` reads the files.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from geoprobe.errors import BadInput

LOG_TO = ("none", "tensorboard")
FOLDER = "tensorboard"
LOG_EVERY = 10  # steps between writes (each reads the losses back from the device once)


@dataclass(frozen=True)
class Tracking:
    """Where training runs log (`to`: one of LOG_TO) and how many tokens a step trains on
    (None: tokens/s is not written)."""
    to: str = "none"
    tokens_per_step: int | None = None


_current: ContextVar[Tracking] = ContextVar("tracking", default=Tracking())


def check_log_to(value: str) -> str:
    if value not in LOG_TO:
        raise BadInput(f"--log-to must be one of {', '.join(LOG_TO)}, got {value!r}")
    return value


@contextmanager
def tracking(to: str, tokens_per_step: int | None = None):
    """Training runs inside this context log to `to` (checked here, before any work)."""
    token = _current.set(Tracking(check_log_to(to), tokens_per_step))
    try:
        yield
    finally:
        _current.reset(token)


class ScalarLog:
    """One training run's event writer: rank 0's under `--log-to tensorboard`, else a no-op.
    `start`: the step the run resumes from (later events of an interrupted session are dropped)."""

    def __init__(self, folder: Path, main: bool, start: int = 0):
        settings = _current.get()
        self.tokens_per_step = settings.tokens_per_step
        self.writer = None
        if settings.to == "tensorboard" and main:
            from tensorboardX import SummaryWriter

            # named by the step it starts at too: a session resumed within the same second as the last
            # one began (the files are named by the second) gets a file of its own, read after it
            self.writer = SummaryWriter(str(Path(folder) / FOLDER), purge_step=start or None, flush_secs=30,
                                        filename_suffix=f".from-{start:09d}")
        self.since = (start, time.perf_counter())

    @property
    def active(self) -> bool:
        return self.writer is not None

    def losses(self, rows: list[tuple[int, float, float]]) -> None:
        """(step, training loss, learning rate) rows, and the rates since the last call."""
        if self.writer is None or not rows:
            return
        for step, loss, lr in rows:
            self.writer.add_scalar("train/loss", loss, step)
            self.writer.add_scalar("train/lr", lr, step)
        last, now = rows[-1][0] + 1, time.perf_counter()
        steps, seconds = last - self.since[0], now - self.since[1]
        if steps > 0 and seconds > 0:
            self.writer.add_scalar("train/steps_per_second", steps / seconds, last)
            if self.tokens_per_step:
                self.writer.add_scalar("train/tokens_per_second", steps * self.tokens_per_step / seconds, last)
        self.since = (last, now)

    def validation(self, step: int, score: float) -> None:
        if self.writer is not None:
            self.writer.add_scalar("validation/score", score, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
