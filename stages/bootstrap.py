"""bootstrap: build the built-in policy — a BPE tokenizer trained on the games' own text and a tiny GPT-2
pre-trained on *noisy* scripted play, so the base policy is weak but not hopeless.

Inputs: the game modules. Outputs: ``data/bootstrap/model`` (save_pretrained, safetensors),
``data/bootstrap/scripted`` (the scripted episodes, chunked Parquet), ``metrics/plots/bootstrap_loss.json``.
Skipped (an empty model dir with a note) when ``policy.model`` names any HF model.

The scripted player sees every secret of the knowledge base, train and held-out alike, and every group the
run trains or evaluates on (``games.groups`` and ``games.eval_groups``): this is the model's "world knowledge"
(what pre-training gives a real LLM, which has read about every game before it is fine-tuned on any). Everything
after bootstrap — rollouts, pairs, SFT, DPO, RL — touches the training groups' train secrets only, and
evaluation uses held-out secrets, so a leave-one-group-out run (``curio logo G``) fine-tunes without G, as
PAPRIKA's does, on a model that was pre-trained with it.
"""

from __future__ import annotations

import random

from pipeline.core.artifacts import atomic_write_json, chunk_seed, dataset_hash, read_rows, stable_hash
from pipeline.core.checkpoints import keyed_dir, run_key
from pipeline.core.config import ConfigError
from pipeline.core.runners import run_chunked
from pipeline.core.stage import Out, Plot, Stage, StageContext, StageResult
from pipeline.envs.base import format_answer, game_class, make_game
from pipeline.models import tiny
from pipeline.models.training import sft_train
from pipeline.params import Params

NAME = "bootstrap"
METRIC_HELP = {
    "skipped": "1 when policy.model is not the built-in model: nothing to pre-train (the only metric then)",
    "episodes": "scripted episodes pre-trained on",
    "params": "parameters of the built-in model",
    "vocab_size": "tokens in the tokenizer trained on the games' text",
    "median_tokens": "tokens of the median scripted conversation",
    "max_tokens": "tokens of the longest scripted conversation",
    "final_loss": "the training loss at the last logged step",
    "resumed_from_step": "the optimizer step training resumed from (0: it started afresh)",
}

STAGE = Stage(
    NAME,
    params=["seed", "policy.model", "games.groups", "games.eval_groups", "bootstrap"],
    # training.py and attention.py decide the trained weights too (the trainer, and how a packed row attends)
    code=["pipeline/models/tiny.py", "pipeline/models/training.py", "pipeline/models/attention.py", "pipeline/envs"],
    outs=[Out("data/bootstrap", persist=True)],
    plots=[Plot("metrics/plots/bootstrap_loss.json", "Bootstrap (pre-training) loss", x="step", y="loss")],
    models=["bootstrap/model"],
    metric_help=METRIC_HELP,
)
EPISODES_PER_CHUNK = 500


def scripted_episode(game, task, rng: random.Random, noise: float) -> list[dict]:
    """One conversation of the game's scripted player at the given noise level."""
    conversation = game.conversation_start(task)
    state = game.reset(task, rng)
    history: list[tuple[str, str]] = []
    for _ in range(game.max_turns):
        action = game.scripted_action(task, history, rng, noise)
        result = game.step(state, action)
        conversation.append({"role": "assistant", "content": format_answer(action)})
        conversation.append({"role": "user", "content": result.reply})
        history.append((action, result.reply))
        if result.done:
            break
    return conversation


def pretraining_groups(params: Params) -> list[str]:
    """The groups of the scripted pre-training data: the training groups, then any evaluation-only group."""
    return list(dict.fromkeys([*params.games.groups, *(params.games.eval_groups or [])]))


def run(params: Params, ctx: StageContext) -> StageResult:
    cfg = params.bootstrap
    out = params.data_path("bootstrap")
    model_dir = out / "model"
    if not tiny.is_builtin(params.policy.model):
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "SKIPPED").write_text(f"policy.model = {params.policy.model}: nothing to bootstrap\n")
        atomic_write_json(params.plots_path("bootstrap_loss.json"), [])  # dvc.yaml declares the plot
        return StageResult(metrics={"skipped": 1})

    # Only Curio's program games have scripted players: LLM-hosted games and other projects' environments
    # (textarena:, openenv:) give the tiny model no pre-training (it meets them first in rollout-text).
    scripted = [make_game(g) for g in pretraining_groups(params) if game_class(g).env_kind == "program"]
    if not scripted:
        raise ConfigError(f"params: bootstrap: the built-in model pre-trains on the scripted players of "
                          f"games.groups and games.eval_groups, and none of {', '.join(pretraining_groups(params))} "
                          "has one: add one of Curio's program games (e.g. mastermind) to games.groups, or set "
                          "policy.model to a chat model (e.g. presets/smollm2.yaml)")
    tasks = [(g, t) for g in scripted for t in g.tasks("train") + g.tasks("eval")]
    num_chunks = max(1, -(-cfg.episodes // EPISODES_PER_CHUNK))

    def make_chunk(index: int) -> list[dict]:
        rng = random.Random(chunk_seed(params.seed, NAME, index))
        rows = []
        n = min(EPISODES_PER_CHUNK, cfg.episodes - index * EPISODES_PER_CHUNK)
        for _ in range(n):
            game, task = tasks[rng.randrange(len(tasks))]
            # Noise varies per episode around cfg.noise, so the data holds good and poor players.
            noise = min(1.0, rng.uniform(0.0, 2.0 * cfg.noise))
            rows.append({"group": game.name, "task_id": task.task_id, "noise": noise,
                         "conversation": scripted_episode(game, task, rng, noise)})
        return rows

    data_dir = out / "scripted"
    run_chunked(data_dir, num_chunks=num_chunks, make_chunk=make_chunk,
                params_hash=params.section_hash(STAGE.params), desc="scripted play")
    conversations = [r["conversation"] for r in read_rows(data_dir, ["conversation"])]

    openings = [text for g, t in tasks for text in (g.system_prompt(t), g.first_message(t))]
    tokenizer = tiny.train_tokenizer([m["content"] for c in conversations for m in c] + openings, cfg.vocab_size)
    # Checkpoints resume only under the same params, scripted data and game openings (the tokenizer's text).
    ckpt = keyed_dir(out / "checkpoints",
                     run_key(params.section_hash(STAGE.params), dataset_hash(data_dir), stable_hash(openings)))
    model = tiny.build_model(tokenizer, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.n_positions, seed=params.seed)
    lengths = sorted(len(tokenizer.apply_chat_template(c, return_dict=False)) for c in conversations)
    # Scripted conversations vary in length (about half of a padded batch is padding): padding-free batches
    # skip that compute, same loss; only when every conversation fits the context, as nothing is truncated.
    model, history, resumed = sft_train(
        model, tokenizer, conversations, ckpt,
        lr=cfg.lr, epochs=cfg.epochs, batch_size=cfg.batch_size, seed=params.seed,
        tracker=ctx.tracker, prefix="bootstrap", padding_free=lengths[-1] <= cfg.n_positions,
    )
    tiny.save(model, tokenizer, model_dir)
    atomic_write_json(params.plots_path("bootstrap_loss.json"), history)
    return StageResult(
        metrics={
            "episodes": len(conversations),
            "params": tiny.param_count(model),
            "vocab_size": len(tokenizer),
            "median_tokens": lengths[len(lengths) // 2],
            "max_tokens": lengths[-1],
            "final_loss": history[-1]["loss"] if history else float("nan"),
            "resumed_from_step": resumed,
        },
        outputs=[str(model_dir)],
    )
