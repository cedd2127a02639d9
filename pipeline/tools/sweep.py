"""A seed sweep as DVC experiments: ``curio sweep seeds N [PRESET...]``.

Each seed is a DVC experiment of the checkout's commit, named ``seed-K`` (``PRESETS-seed-K`` with presets, e.g.
``smollm2-learn-seed-1``). The seeds run one at a time, each in a checkout of its own: a git worktree of the commit
under ``.dvc/tmp/sweeps/NAME`` whose params.yaml is the commit's with the presets' values and ``seed: K``, and whose
DVC cache is this checkout's. There the command runs ``dvc repro [TARGET...]``, showing its output; once it succeeds,
``dvc exp save -n NAME`` keeps the seed as an experiment of the commit (its metrics too, which git does not track)
and the worktree goes. ``dvc exp show`` lists the seeds beside the baseline; ``dvc exp apply NAME`` brings one's
outputs into the workspace. Once every seed has finished, the command prints the sweep's tables
(pipeline/reporting/seeds.py) and writes them to ``data/seeds/NAME/`` (``seeds.md``, ``seeds.json``).

Resumable where it stopped: stopped (SIGINT / SIGTERM), the command passes the signal to every process of the running
seed's ``dvc repro`` and waits for them (two minutes at most, then kills them), so nothing keeps running; the seed's
worktree stays. The same command then skips the seeds that finished and runs ``dvc repro`` again in the stopped
seed's worktree: the stages that finished are skipped, and the stage that was stopped resumes from its own
checkpoint or chunks, as it does under ``dvc repro``. A seed that failed is run again the same way. Seeds are
experiments of the checkout's commit: after a new commit the same command runs a new sweep (a worktree of an older
commit is removed first), and the seeds run the commit, not uncommitted changes (the command says when there are).

The seeds' stages log to this checkout's MLflow store and share its LLM response cache (``MLFLOW_TRACKING_URI``,
``CURIO_CACHE_DIR``, unless set), with the kernels the sweep's params ask for (``reproducible``, ``threads``). Each
stage runs as a process of its own (no warm start, ``CURIO_WARM=0``) and imports the worktree's code (``PYTHONPATH``):
the commit's, whatever this checkout's files are meanwhile.

``--reuse COMMIT`` starts each new seed's worktree from the same seed's experiment of an earlier commit's sweep: its
dvc.lock and outputs, so ``dvc repro`` runs only the stages whose code, params or inputs differ (a change to one
stage's params reruns that stage and those after it, not the DAG). DVC's run cache cannot do this here: the stages'
outputs persist (for resume), and DVC keeps no run cache for those. The skipped stages' metrics (their ``seconds``
too) are the earlier run's.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from pipeline.core.config import ConfigError, _set_dotted, parse_override, preset_overrides
from pipeline.core.errors import CurioError
from pipeline.params import load_params
from pipeline.tools import ToolError
from pipeline.tools.seed_table import FINISHED, dvc, dvc_bin, experiments, write_seed_tables

SWEEPS = Path(".dvc") / "tmp" / "sweeps"  # the seeds' worktrees (DVC's own tmp: git and DVC ignore it)
READY = "curio-sweep-seed"  # written into a worktree's .dvc/tmp once it is set up: one without it is made again
STOP_WAIT_S = 120.0  # a stopped sweep waits this long at most for the seed's processes to exit, then kills them


class SweepStopped(CurioError):
    """The sweep was stopped by a signal; the rerun resumes it."""

    def __init__(self, signum: int, name: str | None) -> None:
        where = f"{name} stopped where it was, its worktree kept" if name else "no seed was running"
        super().__init__(f"sweep stopped ({signal.Signals(signum).name}): {where}; finished seeds are kept: rerun "
                         "the same command to resume")
        self.exit_code = 128 + signum


def sweep_prefix(presets: list[str]) -> str:
    """The experiments' name before ``seed-K``: the presets' file names, joined by ``+``, and a dash."""
    return "+".join(Path(p).stem for p in presets) + "-" if presets else ""


def experiment_name(prefix: str, seed: int) -> str:
    return f"{prefix}seed-{seed}"


def git(*args: str, cwd: Path | None = None, check: bool = True) -> str:
    res = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if check and res.returncode != 0:
        message = (res.stderr.strip() or res.stdout.strip() or "failed").splitlines()
        raise ToolError(f"git {' '.join(args[:2])}: {message[0] if message else 'failed'}")
    return res.stdout.strip()


def seed_overrides(presets: list[str]) -> list[str]:
    """The presets' values as ``key=value`` overrides, checked against the params schema before any seed runs."""
    overrides = preset_overrides(*presets) if presets else []
    load_params("params.yaml", overrides)
    return overrides


def write_seed_params(checkout: Path, overrides: list[str], seed: int) -> None:
    """The worktree's params.yaml: the commit's, with the presets' values and the seed (what ``dvc exp run -S``
    would set)."""
    path = checkout / "params.yaml"
    raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    for override in [*overrides, f"seed={seed}"]:
        _set_dotted(raw, *parse_override(override))
    path.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True), encoding="utf-8")


def drop_checkout(checkout: Path) -> None:
    git("worktree", "remove", "--force", str(checkout), check=False)
    shutil.rmtree(checkout, ignore_errors=True)
    git("worktree", "prune", check=False)


def reused_experiment(rev: str, name: str) -> str:
    """The commit of experiment ``name`` of commit ``rev`` (DVC keeps a finished one at
    ``refs/exps/<rev[:2]>/<rev[2:]>/<name>``); a one-line error where there is none."""
    found = git("rev-parse", "--verify", "-q", f"refs/exps/{rev[:2]}/{rev[2:]}/{name}", check=False)
    if not found:
        raise ToolError(f"--reuse {rev[:7]}: no finished experiment {name} of that commit (`dvc exp list {rev[:7]}` "
                        f"lists them)")
    return found


def stage_outs(checkout: Path) -> dict[str, list[str]]:
    """Each stage of the worktree's dvc.yaml and the paths of its outputs."""
    stages = (yaml.safe_load((checkout / "dvc.yaml").read_text(encoding="utf-8")) or {}).get("stages") or {}
    return {name: [next(iter(o)) if isinstance(o, dict) else str(o) for o in stage.get("outs") or []]
            for name, stage in stages.items()}


def start_from(checkout: Path, exp: str, targets: list[str]) -> list[str]:
    """Start a new worktree where experiment ``exp`` (a seed of an earlier commit's sweep) ended: its dvc.lock, the
    outputs git keeps for it (metrics, plots) and those DVC keeps, from the cache. ``dvc repro`` then runs only the
    stages whose code, params or inputs differ from that run; the outputs of each stage ``dvc status`` finds changed
    are removed first, so none resumes from that run's parts (a stage keys its parts and checkpoints by its params
    and inputs, not by its code). Returns those stages."""
    outs = stage_outs(checkout)
    paths = [p for ps in outs.values() for p in ps]
    saved = [f for f in git("ls-tree", "-r", "--name-only", exp, cwd=checkout).splitlines()
             if f == "dvc.lock" or any(f == p or f.startswith(p.rstrip("/") + "/") for p in paths)]
    if "dvc.lock" not in saved:
        raise ToolError(f"--reuse: experiment {exp[:7]} has no dvc.lock")
    git("checkout", exp, "--", *saved, cwd=checkout)
    git("reset", "-q", "--", *saved, cwd=checkout)  # untracked again, as a seed's own run leaves them
    dvc("checkout", "--force", "--allow-missing", "-q", cwd=checkout)
    status = json.loads(dvc("status", "--json", *(["--with-deps", *targets] if targets else []),
                            cwd=checkout).stdout or "{}")
    again = [name for name in outs if name in status]
    for name in again:
        for path in outs[name]:
            out = checkout / path
            if out.is_dir() and not out.is_symlink():
                shutil.rmtree(out)
            else:
                out.unlink(missing_ok=True)
    return again


def resumable(checkout: Path, head: str) -> bool:
    """Whether ``checkout`` is a seed's worktree of commit ``head`` that a stopped or failed run set up."""
    return (checkout / ".dvc" / "tmp" / READY).is_file() and git("rev-parse", "HEAD", cwd=checkout, check=False) == head


def seed_checkout(name: str, seed: int, overrides: list[str], head: str,
                  reuse: str | None = None, targets: list[str] | None = None) -> tuple[Path, bool]:
    """The seed's worktree, and whether it is one a stopped or failed run left (set up, of this commit). A new one
    starts from experiment ``name`` of commit ``reuse`` where one is given (:func:`start_from`)."""
    checkout = SWEEPS / name
    if resumable(checkout, head):
        return checkout, True
    if checkout.exists():  # half made, or of another commit
        drop_checkout(checkout)
    checkout.parent.mkdir(parents=True, exist_ok=True)
    git("worktree", "add", "--detach", str(checkout), head)
    local = Path(".dvc") / "config.local"  # this checkout's own DVC settings (a remote, ...) hold there too
    if local.is_file():
        shutil.copyfile(local, checkout / ".dvc" / "config.local")
    dvc("cache", "dir", "--local", str(Path(dvc("cache", "dir").stdout.strip()).resolve()), cwd=checkout)
    write_seed_params(checkout, overrides, seed)
    if reuse:
        exp = reused_experiment(reuse, name)
        again = start_from(checkout, exp, targets or [])
        print(f"curio sweep: {name}: starts from experiment {exp[:7]} of {reuse[:7]}; runs again: "
              f"{', '.join(again) or 'no stage'} (code, params or inputs differ)", flush=True)
    (checkout / ".dvc" / "tmp").mkdir(parents=True, exist_ok=True)
    (checkout / ".dvc" / "tmp" / READY).write_text(f"{seed}\n", encoding="utf-8")
    return checkout, False


def save_experiment(checkout: Path, name: str, targets: list[str]) -> None:
    """``dvc exp save -n NAME [TARGET...]`` in the worktree (the stages repro ran: the others have no outputs to
    commit), with the files git does not track (the metrics, the plots' data): without them the experiment's commit
    would hold only what DVC tracks."""
    untracked = git("ls-files", "--others", "--exclude-standard", cwd=checkout).splitlines()
    include = [a for f in untracked for a in ("-I", f)]  # -f: over what a save cut short by a stop left
    dvc("exp", "save", "-f", "-n", name, *targets, *include, cwd=checkout)


class SeedRepro:
    """The running seed's ``dvc repro``: a stop passes the signal to each of its processes and waits for them."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.name: str | None = None

    def repro(self, name: str, checkout: Path, targets: list[str]) -> int:
        path = os.pathsep.join(p for p in (str(checkout.resolve()), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path}  # the stages import the commit's code first
        self.name, self.proc = name, subprocess.Popen([dvc_bin(), "repro", *targets], cwd=checkout, env=env)
        try:
            return self.proc.wait()
        finally:
            self.name, self.proc = None, None

    def stop(self, signum: int, wait_s: float = STOP_WAIT_S) -> None:
        import psutil

        if self.proc is None:
            return
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signum)
        _, alive = psutil.wait_procs(procs, timeout=wait_s)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=10)

    @contextlib.contextmanager
    def stop_on_signal(self) -> Iterator[None]:
        """SIGINT / SIGTERM: stop the running seed's processes, then raise :class:`SweepStopped`."""
        def stop(signum: int, _frame: object) -> None:
            for s in (signal.SIGINT, signal.SIGTERM):
                signal.signal(s, signal.SIG_IGN)  # one stop at a time
            name = self.name
            self.stop(signal.SIGTERM)  # what each stage saves its progress on
            raise SweepStopped(signum, name)

        previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def shared_stores(params: Any) -> None:
    """The seeds' stages log to this checkout's MLflow store and read its LLM cache (they run in worktrees)."""
    os.environ.setdefault("CURIO_CACHE_DIR", str(Path.cwd() / ".cache" / "curio"))
    if not params.tracking.uri:
        os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{Path.cwd() / 'mlflow.db'}")


def run_seeds(names: dict[int, str], overrides: list[str], targets: list[str], runner: SeedRepro,
              reuse: str | None = None) -> dict[str, str]:
    """Each seed not finished, in its worktree, one at a time; every seed's state at the end."""
    head = git("rev-parse", "HEAD")
    found = experiments()
    states: dict[str, str] = {}
    for seed, name in names.items():
        known = found.get(name, {})
        if known.get("state") == FINISHED:
            print(f"curio sweep: {name}: finished (experiment {str(known['rev'])[:7]})", flush=True)
            if (SWEEPS / name).exists():  # saved, then stopped before its worktree went
                drop_checkout(SWEEPS / name)
            states[name] = FINISHED
            continue
        if known.get("task"):  # an entry of DVC's queue, from a sweep of an earlier version: this one runs it
            dvc("queue", "remove", str(known["task"]), check=False)
        checkout, resumed = seed_checkout(name, seed, overrides, head, reuse, targets)
        print(f"curio sweep: {name}: {'resumes' if resumed else 'runs'} in {checkout}", flush=True)
        code = runner.repro(name, checkout, targets)
        if code != 0:
            print(f"curio sweep: {name}: failed (dvc repro exit {code}); its worktree is kept", flush=True)
            states[name] = "failed"
            continue
        save_experiment(checkout, name, targets)
        drop_checkout(checkout)
        states[name] = FINISHED
    return states


def sweep_seeds(count: int, presets: list[str], first: int, targets: list[str], reuse: str | None = None) -> list[str]:
    """Run the seeds not finished, one at a time; the sweep's tables (pipeline/reporting/seeds.py) once every seed
    has finished. ``reuse``: a commit whose sweep's experiments the new seeds start from (:func:`start_from`)."""
    from pipeline.core.kernels import settle
    from pipeline.core.tracking import pipeline_run
    from pipeline.core.warm import ENABLE_ENV

    if not Path("dvc.yaml").is_file():
        raise ToolError("no dvc.yaml here: run `curio sweep` in the project's checkout")
    # dvc, and the stages' curio, from this environment (`.venv/bin/curio sweep` without an activated venv)
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    prefix = sweep_prefix(presets)
    names = {seed: experiment_name(prefix, seed) for seed in range(first, first + count)}
    try:
        overrides = seed_overrides(presets)
        params = load_params("params.yaml", [*overrides, f"seed={first}"])
    except (OSError, ConfigError) as e:
        raise ToolError(str(e).splitlines()[0]) from None
    if reuse:
        rev = git("rev-parse", "--verify", "-q", f"{reuse}^{{commit}}", check=False)
        if not rev:
            raise ToolError(f"--reuse {reuse}: not a commit of this repository")
        done, head = experiments(), git("rev-parse", "HEAD")
        for name in names.values():  # every seed still to set up has its experiment there, before any runs
            if done.get(name, {}).get("state") != FINISHED and not resumable(SWEEPS / name, head):
                reused_experiment(rev, name)
        reuse = rev
    if git("status", "--porcelain", "--untracked-files=no"):
        print("curio sweep: the checkout has uncommitted changes; the seeds run its commit without them", flush=True)
    start = time.perf_counter()
    settle(params.reproducible, params.threads)  # the kernels of the seeds' stages
    os.environ[ENABLE_ENV] = "0"  # no warm start (see the module's docstring)
    shared_stores(params)
    tracking = params.tracking  # the seeds' stage runs nest under one MLflow run of the sweep, as under make run
    runner = SeedRepro()
    with runner.stop_on_signal(), \
            pipeline_run(f"sweep {prefix}seeds", experiment=tracking.experiment, enabled=tracking.enabled,
                         artifact_root=tracking.artifact_root, uri=tracking.uri):
        states = run_seeds(names, overrides, targets, runner, reuse)
    print(f"curio sweep: {time.perf_counter() - start:.0f} s this run", flush=True)
    failed = [n for n in names.values() if states.get(n) != FINISHED]
    if failed:
        raise ToolError(f"{', '.join(failed)} did not finish (its output above says why; its worktree is "
                        f"{SWEEPS / failed[0]}); rerun the same command to run it again from where it stopped")
    return write_seed_tables(prefix, list(names.values()))
