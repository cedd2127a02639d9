"""Where chunked work runs: in this process (``local``), on a Dask cluster or on a Ray cluster, through
Prefect's task runners (``runner`` in params.yaml).

A stage's chunks go to a cluster only when the stage describes them as a :class:`ChunkJob`: plain data plus
two picklable functions, ``load`` (what every chunk shares: a policy, a judge) and ``run`` (one chunk). Each
worker process builds ``load()`` once and keeps it for the chunks it is given, so a model is loaded once per
worker, never shipped with a chunk. A chunk is the unit of work and of resume: the driver writes each part as
its chunk comes back, so a lost worker costs its chunk only (the scheduler reruns it elsewhere) and a killed
driver keeps every part already written. A plain ``make_chunk`` callable always runs in the driver.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from tqdm.auto import tqdm

from pipeline.core import interrupt
from pipeline.core.artifacts import SCHEMA_VERSION, ChunkedDataset

if TYPE_CHECKING:
    from prefect.task_runners import TaskRunner

    from pipeline.core.config import RunnerConfig

# As in pipeline/orchestration/flows.py, before prefect reads its settings: no analytics, and the ephemeral API gets
# more than its default 20 s to start on a loaded machine.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")

_ACTIVE: contextvars.ContextVar[RunnerConfig | None] = contextvars.ContextVar("curio_runner", default=None)


@contextlib.contextmanager
def use_runner(cfg: RunnerConfig) -> Iterator[None]:
    """Run the chunked work started inside the block on ``cfg``'s runner (set by ``pipeline.core.stage.execute``)."""
    token = _ACTIVE.set(cfg)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_runner() -> RunnerConfig | None:
    return _ACTIVE.get()


@dataclasses.dataclass(frozen=True)
class ChunkJob:
    """A stage's chunks as data: chunk ``i`` is ``run(load(), i, inputs[i])``.

    ``load`` and ``run`` must pickle (module-level functions, or ``functools.partial`` of them over params and
    paths); ``inputs[i]`` is what chunk i alone needs (a slice of rows, task ids) and travels with that chunk
    only. ``load()`` runs once per process that computes chunks, keyed by what it loads.
    """

    run: Callable[[Any, int, Any], Any]
    inputs: Sequence[Any]
    load: Callable[[], Any] | None = None

    def __len__(self) -> int:
        return len(self.inputs)


# -- in a worker process -------------------------------------------------------------------------------------
_LOADED: dict[str, Any] = {}
_LOAD_LOCK = threading.Lock()


def _load_key(load: Callable[[], Any]) -> str:
    import cloudpickle

    return hashlib.sha256(cloudpickle.dumps(load)).hexdigest()


def loaded(load: Callable[[], Any] | None) -> Any:
    """``load()``, built once per process and kept while the same loader is asked for (a new one replaces it,
    so a worker holds one set of models at a time)."""
    if load is None:
        return None
    key = _load_key(load)
    with _LOAD_LOCK:
        if key not in _LOADED:
            for state in _LOADED.values():
                _stop_processes(state)
            _LOADED.clear()
            _LOADED[key] = load()
        return _LOADED[key]


def _stop_processes(state: Any) -> None:
    """Close what a dropped state runs outside this process (a backend's own server: ``owns_process``)."""
    for item in state if isinstance(state, tuple | list) else (state,):
        if getattr(item, "owns_process", False):
            item.close()


def release(load: Callable[[], Any] | None) -> None:
    """Drop what ``load`` built from this process's cache (the driver, once a local run of chunks is over); a
    server one of its backends started stops with it."""
    if load is not None:
        with _LOAD_LOCK:
            state = _LOADED.pop(_load_key(load), None)
        _stop_processes(state)


def _set_torch_threads(n: int) -> None:
    # Each worker is one process on one core: torch's own thread pool would only oversubscribe the cores.
    os.environ["OMP_NUM_THREADS"] = str(n)
    import torch

    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


def compute_chunk(run: Callable[[Any, int, Any], Any], load: Callable[[], Any] | None, index: int, item: Any,
                  torch_threads: int) -> Any:
    """One chunk in a worker: the shared state from this process's cache, then ``run``."""
    _set_torch_threads(torch_threads)
    return run(loaded(load), index, item)


# -- the task runners ----------------------------------------------------------------------------------------
def task_runner(cfg: RunnerConfig, local_workers: int = 1) -> TaskRunner:
    """The Prefect task runner of ``cfg``: ``local`` = threads in this process (``local_workers`` of them),
    ``dask`` = prefect-dask on ``cfg.address`` (a ``distributed`` scheduler) or a local cluster of
    ``cfg.workers`` processes, ``ray`` = prefect-ray on ``cfg.address`` or a local Ray head."""
    if cfg.kind == "local":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=local_workers)
    env = {"OMP_NUM_THREADS": str(cfg.torch_threads), "TQDM_DISABLE": os.environ.get("TQDM_DISABLE", "1")}
    if cfg.kind == "dask":
        from prefect_dask import DaskTaskRunner

        if cfg.address:
            return DaskTaskRunner(address=cfg.address)
        return DaskTaskRunner(cluster_kwargs={
            "n_workers": cfg.workers, "threads_per_worker": 1, "processes": True, "host": "127.0.0.1",
            "dashboard_address": ":0", "env": env})
    from prefect_ray import RayTaskRunner

    init: dict[str, Any] = {"runtime_env": {"env_vars": env}, "include_dashboard": False}
    if not cfg.address:
        init["num_cpus"] = cfg.workers
    return RayTaskRunner(address=cfg.address, init_kwargs=init)


@contextlib.contextmanager
def started(cfg: RunnerConfig, local_workers: int = 1) -> Iterator[TaskRunner]:
    """:func:`task_runner`, started. Without ``PREFECT_API_URL`` this process talks to an ephemeral Prefect
    server; Dask / Ray workers are then given its address, so they record their task runs there instead of each
    starting a server of its own (a cluster on other machines needs a real server: set PREFECT_API_URL)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    api = PREFECT_API_URL.value()
    if not api and cfg.kind != "local":
        from prefect.server.api.server import SubprocessASGIServer

        server = SubprocessASGIServer()  # the one this process's Prefect client uses
        server.start()
        api = server.api_url
    with temporary_settings({PREFECT_API_URL: api}) if api else contextlib.nullcontext(), \
            task_runner(cfg, local_workers) as runner:
        yield runner


def _chunk_task():
    """The Prefect task wrapping :func:`compute_chunk` (built lazily: importing prefect costs a second)."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    # Retries: a chunk whose worker died is rerun by the cluster itself (Dask reschedules, Ray retries).
    return task(compute_chunk, name="chunk", task_run_name="chunk {index}", cache_policy=NO_CACHE,
                persist_result=False)


def map_chunks(job: ChunkJob, todo: Sequence[int], cfg: RunnerConfig,
               on_result: Callable[[int, Any], None]) -> None:
    """Compute chunks ``todo`` of ``job`` on ``cfg``'s cluster; ``on_result(index, rows)`` in this process as
    each comes back (in completion order). A failed chunk does not stop the others: every chunk that finishes
    is handed over, then the first error is raised."""
    from prefect.futures import as_completed

    chunk = _chunk_task()
    failure: BaseException | None = None
    with started(cfg) as runner:
        futures = {runner.submit(chunk, parameters={"run": job.run, "load": job.load, "index": i,
                                                    "item": job.inputs[i], "torch_threads": cfg.torch_threads}): i
                   for i in todo}
        for future in as_completed(list(futures)):
            try:
                rows = future.result()
            except Exception as e:  # handed on once the other chunks are written
                failure = failure or e
                continue
            on_result(futures[future], rows)
    if failure is not None:
        raise failure


# -- a dataset computed chunk by chunk over the active runner, resuming from its finished parts --------------
def _shown(path: Path) -> str:
    """``path`` as the line that names a resume point shows it: relative to the working directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def run_chunked(
    path: str | Path,
    *,
    num_chunks: int,
    make_chunk: Callable[[int], Sequence[dict] | pa.Table] | ChunkJob,
    params_hash: str,
    upstream: dict[str, str] | None = None,
    schema: pa.Schema | None = None,
    desc: str = "chunks",
    on_chunk: Callable[[int], None] | None = None,
    schema_version: int = SCHEMA_VERSION,
    companions: Sequence[tuple[str | Path, pa.Schema | None]] = (),
) -> ChunkedDataset:
    """Compute the missing chunks of a dataset (resuming), then mark it complete.

    ``make_chunk(index)`` must be deterministic given the index (derive its seed with :func:`chunk_seed`). A
    :class:`ChunkJob` runs on the runner of ``params.runner`` (Dask / Ray workers compute, this
    process writes each part as it comes back); a plain callable runs here, chunk after chunk. Asked to stop
    (SIGTERM, :mod:`pipeline.core.interrupt`), it raises ``Stopped`` after the next part is written.

    ``schema_version``: the rows' format; a dataset written in another is recomputed, not resumed.
    ``companions``: (path, schema) of datasets that every chunk also adds a part to (its rows of another shape:
    one pass over the work, two tables); ``make_chunk`` then returns ``(rows, companion rows, …)``. A chunk is
    finished when every dataset holds its part; companion parts are written first.
    """
    ds = ChunkedDataset(path, params_hash=params_hash, upstream=upstream, schema_version=schema_version)
    others = [(ChunkedDataset(p, params_hash=params_hash, upstream=upstream, schema_version=schema_version), s)
              for p, s in companions]
    done = set.intersection(ds.finished(), *(o.finished() for o, _ in others))
    todo = [i for i in range(num_chunks) if i not in done]
    runner = active_runner()
    # on SIGTERM: the chunk in flight is finished (or, late in the grace period, dropped), then the stage stops
    with interrupt.at() as point, \
            tqdm(total=num_chunks, initial=num_chunks - len(todo), desc=desc, unit="chunk") as bar:
        def resume_point() -> None:
            done = set.intersection(ds.finished(), *(o.finished() for o, _ in others))
            first = next((i for i in range(num_chunks) if i not in done), num_chunks)
            point.text = f"chunk {first + 1} of {num_chunks} ({_shown(ds.final)})"

        def write(index: int, rows: Any) -> None:
            if others:
                rows, *extra = rows
                for (other, other_schema), other_rows in zip(others, extra, strict=True):
                    other.write_part(index, other_rows, other_schema)
            ds.write_part(index, rows, schema)
            bar.update(1)
            if on_chunk is not None:
                on_chunk(index)
            resume_point()
            if len(ds.finished()) < num_chunks:
                interrupt.check()

        resume_point()
        if todo:
            interrupt.check()  # asked to stop before this dataset started: nothing of it to finish
        if isinstance(make_chunk, ChunkJob):
            try:
                if todo and runner is not None and runner.kind != "local":
                    map_chunks(make_chunk, todo, runner, write)
                else:  # through this process's cache: a stage that built the same state itself (a judge) shares it
                    state = loaded(make_chunk.load) if todo else None
                    for index in todo:
                        write(index, make_chunk.run(state, index, make_chunk.inputs[index]))
            finally:
                release(make_chunk.load)
        else:
            for index in todo:
                write(index, make_chunk(index))
    for other, _ in others:
        other.mark_complete(num_chunks)
    ds.mark_complete(num_chunks)
    return ds
