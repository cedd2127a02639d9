"""ONI's annotator process, track-neutral: spooled messages in, an LLM's labels and a reward table out.

Both tracks run it (pipeline/nethack/oni.py for NetHack's messages, pipeline/text/oni.py for the text agent's
moves); what differs, the labeller and the reward model, is a subclass named by a ``module:attr`` path
(``--factory``), imported when the process starts, so this layer imports no game. The parts talk through files in
one directory, so they work alike with any number of producers and across a kill:

- producers append each message they met to a spool file ``seen/*.jsonl`` (one JSON value per line: the message
  string, or ``{"message": ..., "context": {...}}`` when the labeller needs more than the text; the context of
  the message's first sight is kept). :class:`OnlineRewards` is the NetHack workers' spooler and table reader.
- :class:`OnlineAnnotator` gathers the spooled messages (exact-string dedup), labels the unlabelled ones in batches
  (:meth:`OnlineAnnotator.label`, the subclass's: through Curio's LLM layer — cache, ledger, any backend — or a
  rules program), appends them to ``labels.jsonl``, refits the reward model (:meth:`OnlineAnnotator.fit`) and
  publishes the rewards of every seen message (``rewards.json``, atomically renamed) and its status
  (``status.json``). A failed request leaves the message pending as it was; an unparseable answer is an attempt
  (asked again, at most ``max_attempts`` times, then UNKNOWN for good); an exception in a batch is logged and
  retried after a growing pause — RL goes on.

Resume: the spools and ``labels.jsonl`` (appended and fsynced per batch) are the state, with whatever model file the
subclass saves; the pending queue is "seen but not labelled".

    python -m pipeline.llm.online_annotation --factory pipeline.nethack.oni:OnlineAnnotator --dir D --config JSON
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pipeline.core import interrupt
from pipeline.core.artifacts import atomic_write_bytes, atomic_write_json

LABELLED = {"helpful", "unhelpful"}
UNKNOWN = "UNKNOWN"
FAILED = "[request failed]"  # how a labeller marks an answer that never came (pipeline.llm.pairwise.raw_text)

SEEN = "seen"
LABELS = "labels.jsonl"
TABLE = "rewards.json"
STATUS = "status.json"
PROGRESS = "progress.csv"
LOG = "annotator.log"
#: What every annotator reads from its config (a subclass adds its own keys). ``poll_s``: the pause between looks at
#: the spools when nothing is queued; ``publish_s``: a queue longer than a batch is labelled batch after batch for up
#: to this long (wall) before the table is published, so a long queue costs one publication every ``publish_s``, not
#: one per batch.
DEFAULTS: dict[str, Any] = {"batch_size": 32, "max_attempts": 3, "seed": 0, "poll_s": 0.5, "publish_s": 2.0}
#: The parts of the annotator's CPU time that its status reports (``cpu_<part>_s``), summed over restarts.
CPU_PARTS = ("label", "fit", "publish")


def updates_for_batch(batch_number: int, first: int, least: int) -> int:
    """Gradient steps after the ``batch_number``-th (1-based) labelled batch: first/k, never below ``least``."""
    return max(least, first // max(batch_number, 1))


def is_held_back(message: str, every: int) -> bool:
    """Every ``every``-th message (by a hash of its text, so stable across restarts) is kept for accuracy."""
    if every <= 0:
        return False
    return int(hashlib.sha1(message.encode()).hexdigest()[:8], 16) % every == 0


# -- producer side ----------------------------------------------------------------------------------------------
class OnlineRewards:
    """r(m) in a producer process: the published table, refreshed; unseen messages go to the spool."""

    def __init__(self, directory: str | Path, refresh_s: float = 2.0) -> None:
        self.directory = Path(directory)
        self.refresh_s = refresh_s
        self.table: dict[str, float] = {}
        self.version = -1
        self._mtime = 0.0
        self._seen: set[str] = set()
        self._buffer: list[str] = []
        self._next_check = 0.0
        self._spool: Any = None

    def __call__(self, message: str) -> float:
        if message and message not in self._seen:
            self._seen.add(message)
            self._buffer.append(message)
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self.refresh_s
            self.flush()
            self.refresh()
        return self.table.get(message, 0.0)

    def flush(self) -> None:
        """Append the buffered new messages to this process's spool (one JSON string per line)."""
        if not self._buffer:
            return
        if self._spool is None:
            spool_dir = self.directory / SEEN
            spool_dir.mkdir(parents=True, exist_ok=True)
            self._spool = open(spool_dir / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl", "a")  # noqa: SIM115
        self._spool.write("".join(json.dumps(m) + "\n" for m in self._buffer))
        self._spool.flush()
        self._buffer.clear()

    def refresh(self) -> None:
        path = self.directory / TABLE
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            return
        if mtime == self._mtime:
            return
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return  # a torn read cannot happen (atomic rename) but a vanished file can; keep the old table
        self._mtime = mtime
        self.version = int(data.get("version", 0))
        self.table = {m: float(r) for m, r in data["rewards"].items()}


_ONLINE: dict[str, OnlineRewards] = {}


def online_rewards(directory: str | Path, refresh_s: float = 2.0) -> OnlineRewards:
    """One table and one spool per process and directory, shared by all its producers."""
    key = str(directory)
    if key not in _ONLINE:
        import atexit

        _ONLINE[key] = OnlineRewards(directory, refresh_s)
        atexit.register(_ONLINE[key].flush)
    return _ONLINE[key]


# -- the annotator ----------------------------------------------------------------------------------------------
class OnlineAnnotator:
    """Labels spooled messages in batches, refits the reward model, publishes the reward table.

    A track subclasses it with :meth:`label` (required), and :meth:`fit`, :meth:`rewards`, :meth:`load_model`,
    :meth:`asks_labels`, :meth:`spool_files`, :meth:`publish` where it needs to.

    Args:
        directory: the annotator's directory (spools, labels, model, table, status).
        config: :attr:`defaults` overridden by the run's settings.
        backend: the labelling backend (default: the subclass builds it from its config); tests pass their own.
    """

    defaults: dict[str, Any] = DEFAULTS

    def __init__(self, directory: str | Path, config: dict | None = None, *, backend: Any = None) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.cfg = {**DEFAULTS, **self.defaults, **(config or {})}
        self._backend = backend
        self.seen: dict[str, None] = {}  # insertion-ordered set
        self.context: dict[str, Any] = {}  # a message's context at its first sight, when its producer gave one
        self._offsets: dict[Path, int] = {}
        self.labels: dict[str, str] = {}  # final labels (helpful / unhelpful, or UNKNOWN after max_attempts)
        self.attempts: dict[str, int] = {}
        self.batches = 0
        self.started = time.monotonic()
        self.labelled_this_run = 0
        self.cpu_before = 0.0  # CPU seconds of this directory's earlier annotator processes (its last status)
        self.cpu_parts = dict.fromkeys(CPU_PARTS, 0.0)  # CPU seconds by part (CPU_PARTS), earlier processes included
        self.errors = 0
        self._published = False
        self.setup()
        self._load()

    def _load_labels(self) -> None:
        path = self.directory / LABELS
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a line cut by a kill: its message is asked again (it is still in the cache)
                m, label = row["message"], row["label"]
                self.attempts[m] = self.attempts.get(m, 0) + 1
                if label in LABELLED or self.attempts[m] >= self.cfg["max_attempts"]:
                    self.labels[m] = label
                self.batches = max(self.batches, int(row.get("batch", 0)))

    def _load(self) -> None:
        """The state on disk: labels, the CPU time spent so far, then the subclass's model."""
        self._load_labels()
        try:
            last = json.loads((self.directory / STATUS).read_text())
            self.cpu_before = float(last.get("cpu_s", 0.0))
            self.cpu_parts = {part: float(last.get(f"cpu_{part}_s", 0.0)) for part in CPU_PARTS}
        except (OSError, ValueError, TypeError, AttributeError):
            self.cpu_before = 0.0
        self.load_model()

    # -- what a track provides
    def setup(self) -> None:
        """The subclass's own state, set before the state on disk is loaded (``self.cfg`` is there)."""

    def label(self, batch: list[str]) -> list[tuple[str, str]]:
        """(label, raw answer) per message: helpful / unhelpful / UNKNOWN; a raw answer starting with
        :data:`FAILED` marks a request that never got an answer (not an attempt)."""
        raise NotImplementedError

    def asks_labels(self) -> bool:
        return True

    def load_model(self) -> None:
        pass

    def prepare(self) -> None:
        """Load what labelling needs (a model, a client) before the first messages come: the process calls it
        before its loop, so its start-up overlaps the trainer's instead of the first batch."""

    def fit(self) -> None:
        """Refit the reward model on the labels so far (after a labelled batch)."""

    def rewards(self) -> dict[str, float]:
        """The reward of every seen message (default: the label itself, 0 until labelled)."""
        return {m: float(label == "helpful") for m, label in self.labels.items() if label in LABELLED}

    def spool_files(self) -> list[Path]:
        """The spool files to read now, in order (default: all of them, by name)."""
        spool_dir = self.directory / SEEN
        return sorted(spool_dir.glob("*.jsonl")) if spool_dir.exists() else []

    @property
    def backend(self) -> Any:
        return self._backend

    # -- the queue
    def poll(self) -> int:
        """Read what the producers spooled since the last poll; returns how many messages were new."""
        new = 0
        for path in self.spool_files():
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line still being written waits for the next poll
            for line in data[:end].splitlines():
                try:
                    item = json.loads(line)
                except ValueError:
                    continue
                m, context = (item["message"], item.get("context")) if isinstance(item, dict) else (item, None)
                if m not in self.seen:
                    self.seen[m] = None
                    if context is not None:
                        self.context[m] = context
                    new += 1
            self._offsets[path] = offset + end
        return new

    def pending(self) -> list[str]:
        if not self.asks_labels():
            return []
        return [m for m in self.seen if m not in self.labels]

    # -- one round
    def step(self) -> bool:
        """Poll; label the queue batch after batch, refitting after each, for up to ``publish_s``; publish once;
        True if anything changed."""
        new = self.poll()
        labelled = False
        asked: set[str] = set()  # a request that failed is asked again in the next step, not in this one
        start = time.monotonic()
        while batch := [m for m in self.pending() if m not in asked][: self.cfg["batch_size"]]:
            asked.update(batch)
            with self._cpu("label"):
                self._label(batch)
            with self._cpu("fit"):
                self.fit()
            labelled = True
            if time.monotonic() - start >= self.cfg["publish_s"]:
                break
        if labelled or new or not self._published:
            with self._cpu("publish"):
                self.publish()
            self.write_status()
            return True
        return False

    @contextlib.contextmanager
    def _cpu(self, part: str) -> Iterator[None]:
        """Adds the CPU time of the block to ``cpu_parts[part]``."""
        start = time.process_time()
        try:
            yield
        finally:
            self.cpu_parts[part] += time.process_time() - start

    def _label(self, batch: list[str]) -> None:
        """Label one batch and append it to labels.jsonl. A request that failed (server down, timeout) is not an
        attempt: the message stays pending as it was; an unparseable answer is, up to ``max_attempts``."""
        answers = self.label(batch)
        self.batches += 1
        rows = []
        failed = 0
        for m, (label, raw) in zip(batch, answers, strict=True):
            if label == UNKNOWN and raw.startswith(FAILED):
                failed += 1
                continue
            self.attempts[m] = self.attempts.get(m, 0) + 1
            if label in LABELLED or self.attempts[m] >= self.cfg["max_attempts"]:
                self.labels[m] = label
                self.labelled_this_run += label in LABELLED
            rows.append(json.dumps({"message": m, "label": label, "raw": raw, "batch": self.batches}) + "\n")
        if rows:
            with open(self.directory / LABELS, "a") as f:
                f.write("".join(rows))
                f.flush()
                os.fsync(f.fileno())
        if failed == len(batch):
            raise RuntimeError(f"oni: all {failed} label requests of batch {self.batches} failed")

    def publish(self) -> None:
        table = {m: r for m, r in self.rewards().items() if r != 0.0}  # absent = 0: keeps the file small
        # compact: the workers re-read it whole whenever it changes
        data = json.dumps({"version": self.batches, "rewards": table}, separators=(",", ":"))
        atomic_write_bytes(self.directory / TABLE, data.encode())
        self._published = True

    def status(self) -> dict[str, float | int]:
        final = [label for label in self.labels.values() if label in LABELLED]
        elapsed = max(time.monotonic() - self.started, 1e-9)
        ledger = getattr(self._backend, "ledger", None) if self.asks_labels() else None
        out: dict[str, float | int] = {
            "seen": len(self.seen),
            "labels": len(final),
            "pending": len(self.pending()),
            "given_up": sum(label not in LABELLED for label in self.labels.values()),
            "helpful_share": round(sum(label == "helpful" for label in final) / len(final), 4) if final else 0.0,
            "labels_per_s": round(self.labelled_this_run / elapsed, 3),
            "cpu_s": round(self.cpu_before + time.process_time(), 1),  # the labeller's compute, over restarts
            **{f"cpu_{part}_s": round(seconds, 2) for part, seconds in self.cpu_parts.items()},
            "batches": self.batches,
            "errors": self.errors,
        }
        if ledger is not None:
            out.update(ledger.metrics(prefix="llm"))
        return out

    def write_status(self) -> None:
        atomic_write_json(self.directory / STATUS, {**self.status(), "time": time.time()})

    def run(self, should_stop: Any = lambda: False) -> None:
        """Work until ``should_stop()``; an exception in a round (a dead server, a bug in a backend) is logged
        and retried after a growing pause, never raised: the agent keeps training on the last table."""
        pause = self.cfg["poll_s"]
        while not should_stop():
            try:
                busy = self.step()
                pause = self.cfg["poll_s"]
            except Exception:  # noqa: BLE001 — labelling must never take RL down
                self.errors += 1
                traceback.print_exc()
                busy = False
                pause = min(pause * 2, 30.0)
                try:
                    self.write_status()
                except OSError:
                    pass
            if not busy:
                time.sleep(pause)


# -- the process ------------------------------------------------------------------------------------------------
def annotator_preexec() -> None:
    """In the annotator child: SIGTERM when the trainer dies (even SIGKILLed).

    It runs at the trainer's priority: the scheduler gives it the share of a core that one agent's process gets
    when the cores are busy, and it takes only what labelling needs (a niced labeller, nice 10, got a tenth of an
    agent's share beside four agents and lagged behind their messages for a whole run)."""
    interrupt.signal_on_parent_death(signal.SIGTERM)


def launch(directory: str | Path, factory: str, settings: dict) -> subprocess.Popen:
    """Start the annotator process for ``directory`` (its output goes to ``annotator.log`` there)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    with open(directory / LOG, "a") as log:  # the child holds its own descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "pipeline.llm.online_annotation", "--factory", factory, "--dir", str(directory),
             "--config", json.dumps(settings)],
            stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=annotator_preexec,
        )


def stop(proc: subprocess.Popen | None, timeout: float = 30.0) -> None:
    """SIGTERM (it finishes its batch's bookkeeping; the queue is on disk), then SIGKILL after ``timeout``."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def load_factory(path: str) -> Any:
    """``module:attr`` → the annotator class (or any callable taking ``(directory, config)``)."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"online annotation: factory {path!r} is not 'module:attr'")
    return getattr(importlib.import_module(module), attr)


def main(argv: Iterable[str] | None = None, factory: str | None = None) -> int:
    parser = argparse.ArgumentParser(description="ONI annotator: label spooled messages online")
    parser.add_argument("--factory", default=factory, required=factory is None,
                        help="module:attr of the track's OnlineAnnotator subclass")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--config", default="{}", help="JSON object overriding the defaults")
    args = parser.parse_args(list(argv) if argv is not None else None)
    import torch

    torch.set_num_threads(1)  # the trainer has the cores; labelling only has to keep up
    parent = os.getppid()
    flag = {"stop": False}

    def on_term(signum: int, frame: Any) -> None:
        flag["stop"] = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    annotator = load_factory(args.factory)(args.dir, json.loads(args.config))
    annotator.prepare()
    annotator.run(lambda: flag["stop"] or os.getppid() != parent)
    annotator.write_status()
    return 0


if __name__ == "__main__":
    sys.exit(main())
