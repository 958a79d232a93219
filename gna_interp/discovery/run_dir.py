"""`RunDir`: a discovery that survives a crash (``discover(..., run_dir=PATH)``).

The folder holds:

- ``fingerprint.json``: what the run is of: the settings (`DiscoverySettings.to_dict`), the
  model (name, family, and `weights_hash`: SHA-256 over every parameter and buffer's name,
  dtype, shape and bytes) and the task (name, prompts, and `memo.task_key`: SHA-256 of its
  prompts, segments, candidates and answers). A run that differs in any is refused, naming
  what differs.
- ``stage-NN-<name>.json``: per finished stage (`plan.PLAN`'s ``NN``-th), its record
  (`stage_records`: what it measured and decided, and its cost; `records.record_to_dict`:
  exact, readable JSON), ``{"format": FORMAT, "record": ...}``. A run read back takes the
  records of ``stage-00`` on, up to the first missing file. A remote run's head scan,
  whose spread search is still in flight until the entry stage, counts only with the
  entry stage's record (which holds the finished scan): without it, the head scan runs again.
- ``memo.json``: the accuracy memo (`memo.AccuracyMemo`): every accuracy measured, with the
  stage that measured it and what its forward cost. Read back, the accuracies of finished
  stages are free; those an unfinished stage measured are charged on first use (as their
  forward was); those it recorded without a forward (`memo.remember`) are dropped: it
  records them again when it runs.

Every file is written to a temporary file in the folder, then moved over the old one
(``os.replace``): a crash leaves the old file or the new one, never half of one. Nothing
is a pickle: reading a folder runs no code from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..core.errors import GnaValueError
from ..cost import uncharged
from ..scoring.evaluation import evaluate
from . import memo
from .plan import PLAN, Records, Stage
from .records import key_from_json, key_to_json, record_from_dict, record_to_dict, scan_in_flight
from .runner import runner_for
from .stage_records import EntryRecord

if TYPE_CHECKING:
    from ..models.handle import GnaModel
    from ..tasks.base import Task
    from .plan import Context
    from .settings import DiscoverySettings

FORMAT = 2
"""Version of the files' layout; a folder of another version is refused."""
MEMO_EVERY_S = 2.0
"""Within a stage, the memo is saved after a new accuracy at most this often (and at its end)."""


def weights_hash(model: GnaModel) -> str:
    """SHA-256 over the state dict of ``model.hf_model``: each tensor's name, dtype, shape and
    bytes (a tensor on the ``meta`` device, as a remote model has, by name, dtype and shape:
    NDIF's weights are the hub's, named by the model). Every byte is read: a changed weight
    anywhere is seen. About 250 MiB/s on one loaded CPU core (a 7B model in bf16, 14 GB: about
    a minute; a GPU model's tensors are copied to the CPU one at a time)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.hf_model.state_dict().items()):
        digest.update(repr((name, str(tensor.dtype), tuple(tensor.shape))).encode())
        if tensor.device.type != "meta":
            digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())  # its buffer, not a copy
    return digest.hexdigest()


def fingerprint(model: GnaModel, task: Task, settings: DiscoverySettings) -> dict[str, Any]:
    """What a run directory's discovery is of (module docs)."""
    return {
        "format": FORMAT,
        "settings": settings.to_dict(),
        "model": {"name": model.name, "family": model.arch.family, "weights": weights_hash(model)},
        "task": {"name": task.name, "n_prompts": len(task), "prompts": memo.task_key(task)},
    }


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two fingerprints, in words."""
    found = []
    if old.get("format") != new["format"]:
        found.append(f"file format {old.get('format')!r} (this version writes {new['format']!r})")
    for part in ("settings", "model", "task"):
        before, now = old.get(part, {}), new[part]
        for key in sorted(set(before) | set(now)):
            if before.get(key) != now.get(key):
                what = {"weights": "weights (hash)", "prompts": "prompts (hash)"}.get(key, key)
                found.append(f"{part} {what}: {before.get(key)!r} then, {now.get(key)!r} now")
    return found


class RunDir:
    """A discovery's folder of finished stages and measured accuracies (module docs)."""

    def __init__(
        self, path: str | os.PathLike[str], model: GnaModel, task: Task, settings: DiscoverySettings, stages: Sequence[Stage] = PLAN
    ) -> None:
        self.path = Path(path)
        self.stages = tuple(stages)
        self.path.mkdir(parents=True, exist_ok=True)
        self.model = model
        self.saved_at = 0.0
        self.finished = 0
        mine = fingerprint(model, task, settings)
        stored = self.path / "fingerprint.json"
        if stored.exists():
            found = differences(json.loads(stored.read_text()), mine)
            if found:
                raise GnaValueError(
                    f"run_dir={str(self.path)!r} holds another discovery: {'; '.join(found)}. "
                    "Use a new run_dir, or run with what it was started with"
                )
        else:
            self._write(stored, json.dumps(mine, indent=1).encode())

    def stage_file(self, index: int) -> Path:
        return self.path / f"stage-{index:02d}-{self.stages[index].name}.json"

    def read(self, ctx: Context) -> Records:
        """The records of the finished stages (module docs); the memo read into the open
        one, and the prefix cache filled when stages remain to run."""
        saved: list[dict] = []
        for index in range(len(self.stages)):
            file = self.stage_file(index)
            if not file.exists():
                break
            data = json.loads(file.read_text())
            if data.get("format") != FORMAT:
                raise GnaValueError(f"{file}: format {data.get('format')!r}, expected {FORMAT}: use a new run_dir")
            saved.append(data["record"])
        flying = next((i for i, data in enumerate(saved) if scan_in_flight(data)), None)
        if flying is not None and not any(data["stage"] == EntryRecord.stage for data in saved[flying:]):
            saved = saved[:flying]  # its search's end is lost: the head scan again (its accuracies read from the memo)
        records = Records([record_from_dict(data, ctx) for data in saved])
        self.finished = len(records)
        self._read_memo(ctx.model)
        if records and not records.stopped and len(records) < len(self.stages):
            warm_prefix(ctx.model, ctx.task)
        return records

    def begin(self, index: int) -> None:
        """Stage ``index`` starts: the memo's new accuracies are its."""
        opened = memo.open_memo(self.model)
        if opened is not None:
            opened.stage = index
            opened.on_new = self._memo_saver(opened)

    def write(self, index: int, records: Records) -> None:
        """Stage ``index`` finished: the memo, then its record (the last of ``records``)."""
        opened = memo.open_memo(self.model)
        if opened is not None:
            self._write_memo(opened)
        data = {"format": FORMAT, "record": record_to_dict(records[index])}
        self._write(self.stage_file(index), json.dumps(data, indent=1).encode())
        self.finished = index + 1

    # ----- the memo ------------------------------------------------------------------
    def _memo_saver(self, opened: memo.AccuracyMemo) -> Any:
        def save() -> None:
            if time.monotonic() - self.saved_at >= MEMO_EVERY_S:
                self._write_memo(opened)

        return save

    def _write_memo(self, opened: memo.AccuracyMemo) -> None:
        entries = {key: (value, *opened.measured.get(key, (-1, {}))) for key, value in opened.values.items()}
        for key, counts in opened.pending.items():  # read back, not hit yet: still owed by its stage
            value, stage, _ = entries[key]
            entries[key] = (value, max(stage, opened.stage), counts)
        rows = [[key_to_json(key), *entry] for key, entry in entries.items()]
        self._write(self.path / "memo.json", json.dumps({"format": FORMAT, "entries": rows}).encode())
        self.saved_at = time.monotonic()

    def _read_memo(self, model: GnaModel) -> None:
        file = self.path / "memo.json"
        opened = memo.open_memo(model)
        if opened is None or not file.exists():
            return
        saved = json.loads(file.read_text())
        if saved.get("format") != FORMAT:
            raise GnaValueError(f"{file}: format {saved.get('format')!r}, expected {FORMAT}: use a new run_dir")
        for encoded, value, stage, counts in saved["entries"]:
            key = key_from_json(encoded)
            if stage >= self.finished and not counts:  # recorded without a forward by a stage that did not finish: again when it runs
                continue
            opened.values[key] = value
            if stage >= self.finished:  # measured by a stage that did not finish: its cost owed on first use
                opened.pending[key] = counts
                opened.measured[key] = (stage, counts)

    def _write(self, target: Path, data: bytes) -> None:
        """``data`` into ``target`` atomically: a temporary file in the folder, then `os.replace`."""
        handle, temporary = tempfile.mkstemp(dir=self.path, prefix=f".{target.name}.", suffix=".tmp")
        try:
            with os.fdopen(handle, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def warm_prefix(model: GnaModel, task: Task) -> None:
    """The clean forward over ``task``, charged to no meter (`cost.uncharged`): a resumed
    local run's prefix cache (`GnaModel.prefix_cache`, the one `discover` holds open) holds
    the task's clean streams, as the stages before had left it. A remote model has no
    prefix cache: nothing to do."""
    if not runner_for(model).has_prefix_cache:
        return
    with model.prefix_cache() as cache, uncharged(model):
        if cache is not None:
            evaluate(model, task, progress=False)
