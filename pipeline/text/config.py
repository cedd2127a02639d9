"""The text track's params: the policy, the games, and one section per stage (bootstrap, rollout-text,
annotate-text, pairs-text, reflogprobs, train-sft / train-dpo, rl-text, evaluate-text) and the eval-sweep, with
their defaults and help strings (params.yaml is generated from them)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from pipeline.core.config import Section
from pipeline.llm.config import LLMConfig
from pipeline.models.config import DPOConfigSection, LoraConfigSection, SFTConfigSection
from pipeline.models.reward_net_config import MOTIF_COUNT_EXPONENT, Channels, EmbedDim, Hidden

# -- shared -----------------------------------------------------------------------------------------------
#: The scripted player's default noise (``policy.model: scripted``; ``scripted:NOISE`` sets it).
DEFAULT_NOISE = 0.3


def parse_noise(model: str) -> float:
    """``scripted`` -> 0.3; ``scripted:0.5`` -> 0.5."""
    name, _, value = model.partition(":")
    try:
        noise = float(value or DEFAULT_NOISE)
    except ValueError:
        noise = -1.0
    if name != "scripted" or not 0.0 <= noise <= 1.0:
        raise ValueError(f"policy.model {model!r}: the scripted backend takes 'scripted' or 'scripted:NOISE' "
                         "with NOISE in [0, 1]")
    return noise


#: The named policies, in the order the pipeline trains them (what reports and tables list them in).
POLICIES = ("base", "sft", "dpo", "rl")

class PolicyConfig(Section):
    model: str = Field(
        "builtin",
        description="'builtin' = the tiny LM built by the bootstrap stage; otherwise any HF model id or path",
    )
    backend: Literal["hf", "vllm", "openai", "scripted"] = Field(
        "hf", description="backend that runs the policy; scripted = the games' scripted players (model "
        "'scripted:NOISE', no weights; for benchmarks and tests of rollout / evaluation)")
    device: str = Field("cpu", description="torch device for hf training/inference")
    format_prompt: Literal["game", "rule", "example"] = Field(
        "game", description="how the games' system prompts teach the <Answer> format: game = as written (what "
        "the built-in model is pre-trained on); rule = plus an explicit one-line rule; example = the rule plus the "
        "opening of a train task played by the scripted player (pretrained chat models that ignore the format: "
        "`curio choose format-prompt` chooses on the val split)")
    free_answers: bool = Field(
        False, description="a policy reply without <Answer> tags is read as a move (its first line) instead of "
        "being re-sampled and ending the episode as invalid: small chat models that never write the tags "
        "(SmolLM2-135M) still play, and learn from their own unformatted moves")
    drop_finished: float = Field(
        0.0, ge=0.0, le=1.0, description="hf backend: once this fraction of a batch's rows has finished its "
        "reply, the batch decodes on without them (fewer rows per step instead of padding finished rows up to "
        "the longest reply; the same distribution, other random draws); 0 = every row decodes until the "
        "batch's last one finishes (bench/bench_real_speed.py measures both)")
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="hf backend: the weights' dtype when the policy plays (rollout-text, pairs-text, "
        "rl-text's filtered-BC rounds, evaluate-text); its output layer stays float32, and training, reference "
        "log-probs and ArCHer (which plays the weights it trains) stay float32 on a CPU. bfloat16 plays faster "
        "on a CPU with AVX-512 bf16 (eager attention there), but its replies are not float32's distribution: "
        "speed, replies and held-out results in docs/real-models.md (bench/bench_real_speed.py --dtype)")
    kv_cache_gib: float = Field(
        4.0, ge=0.0, description="hf backend: GiB of keys / values kept across each conversation's turns, so a "
        "turn runs only its new tokens (0 = off, every turn re-encodes its whole conversation). Play steps all its "
        "episodes turn by turn: what does not fit is encoded again each turn (SmolLM2-135M keeps 45 KiB a token in "
        "float32; what the SmolLM2 preset's evaluation needs: docs/results/current/speed-play.md). The same replies "
        "up to float rounding")
    cpu_linear: Literal["torch", "onednn"] = Field(
        "torch", description="hf backend on a CPU: the GEMM of the float32 linear layers when the policy plays. "
        "torch = torch's default (MKL on x86); onednn = oneDNN with the weights reordered once per weights "
        "version (an extra copy of them): decode steps stream the weights faster (measured in "
        "docs/real-models.md; bench/bench_real_speed.py --cpu-linear). Its float sums differ in the last bits. "
        "Training and reference log-probs keep torch's")

    @model_validator(mode="after")
    def _scripted_model(self) -> PolicyConfig:
        if self.backend == "scripted":
            parse_noise(self.model)  # ValueError -> "params: policy: ..." (one line)
        return self


# -- text track --------------------------------------------------------------------------------------------
class BootstrapConfig(Section):
    vocab_size: int = Field(4096, ge=64, le=65536, description="BPE vocabulary size of the built-in "
                            "tokenizer (game words become single tokens: shorter sequences, names never garbled)")
    n_layer: int = Field(3, ge=1, le=48, description="transformer layers of the tiny GPT-2")
    n_embd: int = Field(128, ge=16, le=4096, description="hidden size (divisible by n_head)")
    n_head: int = Field(4, ge=1, le=64, description="attention heads")
    n_positions: int = Field(768, ge=64, le=8192, description="context length in tokens (a whole episode fits)")
    episodes: int = Field(2000, ge=10, description="scripted episodes to pre-train on")
    noise: float = Field(0.35, ge=0.0, le=1.0, description="probability a scripted move is random instead of good")
    epochs: float = Field(4.0, gt=0, description="passes over the scripted episodes")
    lr: float = Field(3e-3, gt=0, description="AdamW learning rate")
    batch_size: int = Field(16, ge=1, description="episodes per step")


class GamesConfig(Section):
    groups: list[str] = Field(["twenty_questions"], min_length=1, description="task groups played; GAME@TIER "
                              "plays a difficulty tier (e.g. twenty_questions@shown4: 4 candidates shown, 3 turns)")
    max_train_tasks: int | None = Field(None, ge=1, description="cap on train tasks per group (None = all)")
    max_eval_tasks: int | None = Field(None, ge=1, description="cap on held-out tasks per group (None = all)")
    val_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="share of each group's train tasks carved "
                                "(deterministically) into a validation split `val` for choosing hyperparameters; "
                                "0 = none, train unchanged")
    eval_groups: list[str] | None = Field(
        None, min_length=1, description="task groups evaluate-text / eval-sweep play (null = groups); training "
        "stages only use groups, so groups minus G with eval_groups [G] is leave-one-group-out (`curio logo G`)",
    )


class CurriculumConfig(Section):
    """PAPRIKA's UCB curriculum over difficulty arms (pipeline/text/curriculum.py) for rollout-text."""

    enabled: bool = Field(False, description="play rounds of curriculum-picked tasks instead of every train "
                          "task once (each round is one Parquet part)")
    alpha: float = Field(1.0, ge=0.0, description="weight of the UCB exploration bonus")
    tasks_per_round: int = Field(16, ge=1, description="tasks picked per round (each played k times)")
    rounds: int | None = Field(None, ge=1, description="rounds played; null = the uniform rollout's budget, "
                               "ceil(train tasks / tasks_per_round)")
    arms: Literal["difficulty", "group_difficulty"] = Field(
        "difficulty", description="difficulty: one arm per label, pooled over groups; group_difficulty: one "
        "arm per (group, label)")


class RolloutTextConfig(Section):
    trajectories_per_task: int = Field(16, ge=1, description="samples per task (PAPRIKA: 4 eval, 20 "
                                       "paper); more samples per secret: better best trajectories, more pairs")
    tasks_per_chunk: int = Field(32, ge=1, description="tasks per Parquet part (the unit of resume)")
    temperature: float = Field(1.0, ge=0.0, description="sampling temperature of the policy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass")
    min_p: float = Field(0.0, ge=0.0, lt=1.0,
                         description="min-p sampling (PAPRIKA: 0.3 with 8B LLMs; 0 for the tiny model)")
    max_new_tokens: int = Field(32, ge=1, le=1024, description="cap on tokens generated per agent turn")
    max_format_retries: int = Field(3, ge=0, le=10, description="re-samples of an unparseable turn before the "
                                    "episode is marked invalid (PAPRIKA: 10)")
    batch_size: int = Field(64, ge=1, description="episodes generated together")
    environment: LLMConfig = Field(default_factory=lambda: LLMConfig(backend="rules", model="oracle"),
                                   description="who answers the agent: rules = program oracle")
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig,
        description="PAPRIKA's UCB curriculum: rounds of tasks picked by learning potential")


class AnnotateTextConfig(Section):
    judge: LLMConfig = Field(default_factory=lambda: LLMConfig(backend="rules", model="exact_match"),
        description="rules: the game's exact-match program; any LLM backend: the <VALID>/<NOTVALID> judge prompt")


class RewardWeightsConfig(Section):
    """Weights of R = llm·mean(interactivity, information gain) + task·accuracy − min(cost·tokens, 1)."""

    llm: float = Field(1.0, ge=0, description="w_llm: weight of mean(interactivity, information gain)")
    task: float = Field(1.0, ge=0, description="w_task: weight of task accuracy")
    cost: float = Field(5e-4, ge=0, description="w_cost: penalty per agent token (capped at 1 in total)")


#: ``pairs_text.judge`` rules programs: ``exact`` = the scores computed from the game's knowledge base.
MULTITURN_RULES_JUDGES = ("exact",)
#: Games whose knowledge base gives the rules ``exact`` judge its scores.
EXACT_GROUPS = ("twenty_questions", "guess_my_city")


def check_multiturn_judge(judge: LLMConfig) -> None:
    """The judge of continuations must answer the multiturn_judge prompt or be a known rules program."""
    if judge.backend == "embedding":
        raise ValueError("judge: the embedding backend cannot score continuations; use rules, hf, "
                         "vllm or openai")
    if judge.backend == "rules" and judge.model not in MULTITURN_RULES_JUDGES:
        raise ValueError(f"judge.model: unknown rules judge {judge.model!r} "
                         f"(known: {', '.join(MULTITURN_RULES_JUDGES)})")


class PairsTextConfig(Section):
    strategy: Literal["paprika", "multiturn"] = Field(
        "paprika", description="paprika: one best-vs-worse pair of whole trajectories per task; multiturn: "
        "per-turn pairs scored by forward-simulated continuations (CollabLLM-style multi-turn-aware reward)")
    turn_threshold: int = Field(2, ge=0, description="chosen must be within this many turns of the best success")
    judge_label_strategy: Literal["as_success", "as_failure", "drop"] = Field(
        "as_failure", description="how judge-invalid successes count"
    )
    pairs_per_task: int = Field(1, ge=1, le=100, description="paprika: pairs made per task")
    groups: list[str] | None = Field(
        None, description="the task groups of the annotated rollouts that pairs and the SFT set are made from: "
        "null = every group they hold (e.g. only the knowledge-base games, for the rules 'exact' multiturn judge)")
    # -- strategy: multiturn -------------------------------------------------------------------------------
    states_per_task: int = Field(4, ge=1, description="multiturn: conversation prefixes (states) sampled per task")
    num_candidates: int = Field(3, ge=2, le=64, description="multiturn: candidate next turns sampled per state")
    num_samples: int = Field(3, ge=1, le=64, description="multiturn: forward continuations per candidate")
    window_size: int = Field(2, ge=0, le=20, description="multiturn: agent turns played after the candidate "
                             "turn in each continuation (0 = the candidate and the reply to it only)")
    min_margin: float = Field(0.0, ge=0, description="multiturn: keep a pair only when best and worst mean "
                              "rewards differ by more than this")
    tasks_per_chunk: int = Field(16, ge=1, description="multiturn: tasks per Parquet part (the unit of resume)")
    reward_weights: RewardWeightsConfig = Field(default_factory=RewardWeightsConfig,
                                                description="multiturn: weights of the CollabLLM-style reward")
    judge: LLMConfig = Field(
        default_factory=lambda: LLMConfig(backend="rules", model="exact"),
        description="multiturn: who scores interactivity / information gain / accuracy of a continuation: "
        "rules 'exact' = computed from the game's knowledge base (twenty_questions, guess_my_city); any chat "
        "backend = the multiturn_judge prompt")

    @model_validator(mode="after")
    def _judge_usable(self) -> PairsTextConfig:
        check_multiturn_judge(self.judge)
        return self


class ReflogprobsConfig(Section):
    batch_size: int = Field(16, ge=1, description="pairs scored per forward pass")
    backend: Literal["hf", "vllm"] = Field(
        "hf", description="hf: the reference model in this process (float32); vllm: vLLM's prompt_logprobs on the "
        "stage's own float32 server of the reference (or base_url's), the token ids sent as they are (docs/vllm.md "
        "gives the measured difference from hf)")
    base_url: str | None = Field(None, description="vllm: a running vLLM server that serves the reference policy")


class TrainPolicyConfig(Section):
    sft: SFTConfigSection = Field(default_factory=SFTConfigSection,
                                  description="SFT on the chosen trajectories (TRL SFTTrainer)")
    dpo: DPOConfigSection = Field(default_factory=DPOConfigSection,
                                  description="DPO on the pairs with the stored reference log-probs (TRL DPOTrainer)")
    lora: LoraConfigSection = Field(default_factory=LoraConfigSection, description="peft LoRA adapters for both phases")
    save_steps: int = Field(50, ge=1, description="checkpoint every N optimizer steps (resume point)")
    num_processes: int = Field(1, ge=1, description="processes training data-parallel under `accelerate launch` "
                               "(train-sft, train-dpo, bootstrap, rl-text); batch sizes stay global: each process "
                               "takes batch_size / num_processes of every batch")
    accelerate_config: str | None = Field(None, description="an accelerate config file (GPUs, machines, mixed "
                                          "precision) for `accelerate launch`; used instead of num_processes")


class CriticConfig(Section):
    """ArCHer's utterance-level double critic (also CHAI's): Q1, Q2 on [h_s; h_a], V1, V2 on h_s."""

    model: str = Field("policy", description="encoder of state and action: `policy` = the initial policy's "
                       "transformer (no download), mean-pooled; or any HF encoder id / path (paper: roberta-base)")
    gamma: float = Field(0.95, gt=0.0, le=1.0, description="discount per agent turn")
    tau: float = Field(0.1, gt=0.0, le=1.0, description="Polyak rate of the target critic")
    lr: float = Field(1e-4, gt=0, description="paper: 2e-5 with RoBERTa-base")
    steps: int = Field(20, ge=1, description="critic gradient steps per round (paper: 50)")
    batch_size: int = Field(32, ge=1, description="transitions per critic step")
    grad_clip: float = Field(1.0, gt=0, description="gradient-norm clip of critic steps")
    buffer_capacity: int = Field(100_000, ge=1, description="newest transitions the critic samples from")
    max_state_tokens: int = Field(256, ge=8, description="state text is left-truncated to this many tokens")


class ArcherConfig(Section):
    actor_lr: float = Field(1e-5, gt=0, description="paper: 1e-6 with GPT-2")
    actor_steps: int = Field(3, ge=0, description="actor gradient steps per round (paper: 3)")
    batch_size: int = Field(16, ge=1, description="states per actor step")
    warmup_rounds: int = Field(1, ge=0, description="critic-only rounds first (paper: 20)")


class ChaiConfig(Section):
    num_samples: int = Field(5, ge=1, description="utterances sampled per turn; the argmax of min(Q1,Q2) is played")


class JudgeRewardConfig(Section):
    """``rl_text.reward: judge``: each played utterance's CollabLLM-style multi-turn-aware reward, as
    ``pairs_text.strategy: multiturn`` scores a candidate turn (pipeline/text/multiturn_pairs.py)."""

    num_samples: int = Field(3, ge=1, le=64, description="forward continuations per utterance, played by the "
                             "round's policy from the utterance on")
    window_size: int = Field(2, ge=0, le=20, description="agent turns played after the utterance in each "
                             "continuation (0 = the utterance and the reply to it only)")
    reward_weights: RewardWeightsConfig = Field(default_factory=RewardWeightsConfig,
                                                description="weights of the CollabLLM-style reward")
    judge: LLMConfig = Field(
        default_factory=lambda: LLMConfig(backend="rules", model="exact"),
        description="who scores interactivity / information gain / accuracy of a continuation: rules 'exact' = "
        "computed from the game's knowledge base (twenty_questions, guess_my_city); any chat backend = the "
        "multiturn_judge prompt")

    @model_validator(mode="after")
    def _judge_usable(self) -> JudgeRewardConfig:
        check_multiturn_judge(self.judge)
        return self


class AnnotateUtterancesConfig(Section):
    """``rl_text.reward: motif``: a judge prefers one of two moves of the same task (Motif's pairwise annotation,
    on the base policy's rollouts); idle (one line in its output) for the other rewards."""

    num_pairs: int = Field(4096, ge=1, description="pairs of moves (same task, same agent turn, two plays), a "
                           "seeded sample of all such pairs")
    context_messages: int = Field(4, ge=0, le=64, description="messages before a move that the reward model "
                                  "reads with it (newest first; the opening prompt never)")
    judge: LLMConfig = Field(
        default_factory=lambda: LLMConfig(backend="rules", model="exact"),
        description="who prefers a move: rules 'exact' = the larger one-turn reward from the game's knowledge "
        "base (twenty_questions, guess_my_city); any chat backend = the Motif-style utterance_preference prompt "
        "(temperature 0.1, top-p 0.95 as Motif's annotator)")


class TrainRewardTextConfig(Section):
    """The utterance reward model: Motif's byte-level network and soft-label Bradley-Terry loss."""

    val_fraction: float = Field(0.2, ge=0.0, lt=1.0, description="pairs held out for agreement (Motif: 80/20)")
    epochs: int = Field(10, ge=1, description="passes over the training pairs (Motif: 10)")
    batch_size: int = Field(64, ge=1, description="pairs per step (Motif: 1024 over 100k+ pairs)")
    lr: float = Field(1e-3, gt=0, description="Adam learning rate (Motif: 1e-5 over 500k pairs)")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    max_len: int = Field(256, ge=8, le=2048, description="bytes of a move and its context the network reads")
    embed_dim: EmbedDim
    channels: Channels
    hidden: Hidden


class MotifRewardConfig(Section):
    """``rl_text.reward: motif``: r = outcome_coef·r_outcome + intrinsic_coef·1[r̃ > ε]·r̃ / N_ep(move)^β."""

    threshold_quantile: float | None = Field(0.5, ge=0.0, le=1.0, description="ε = this quantile of the "
                                             "normalised reward r̃ over the training moves (Motif: 0.5); null = "
                                             "no threshold")
    count_exponent: float = Field(MOTIF_COUNT_EXPONENT, ge=0.0, description="β: a move repeated in one episode "
                                  "earns r̃ / N^β, N = its count so far in the episode "
                                  f"(Motif: {MOTIF_COUNT_EXPONENT:g})")
    intrinsic_coef: float = Field(1.0, ge=0.0, description="weight of the reward model's reward")
    outcome_coef: float = Field(0.0, ge=0.0, description="weight of the game's outcome reward (-1 per turn, 0 "
                                "on the winning one; reward games: the reward on the last turn); 0 = "
                                "intrinsic only, Motif's headline agent. grpo ignores it: its outcome weight is "
                                "grpo.outcome_coef alone, so the outcome is counted once")


class OniModelConfig(Section):
    """The ONI reward model of the text agent: the byte-level network with a logistic head, refit from scratch on
    the labels so far each time the annotator has caught up with a round."""

    steps: int = Field(200, ge=1, description="Adam steps of a refit (minibatches drawn from the labels)")
    batch_size: int = Field(64, ge=1, description="labelled moves per step")
    lr: float = Field(3e-3, gt=0, description="Adam learning rate")
    max_len: int = Field(256, ge=8, le=2048, description="bytes of a move and its context the network reads")
    embed_dim: EmbedDim
    channels: Channels
    hidden: Hidden


class OniTextConfig(Section):
    """``rl_text.reward: oni``: ONI for the text agent. The shared annotator process (the NetHack track's) labels
    each move helpful / unhelpful while rl-text plays; a move's reward is its label (1 / 0) once labelled, else
    ONI's classification reward 1[p(helpful) > 0.5] of the reward model refit on the labels between rounds."""

    annotator: LLMConfig = Field(
        default_factory=lambda: LLMConfig(backend="rules", model="exact"),
        description="who labels a move: rules 'exact' = helpful iff the move's one-turn reward from the game's "
        "knowledge base exceeds label_threshold (twenty_questions, guess_my_city); any chat backend = the "
        "ONI-style prompt (prompts/oni_label.yaml, a final <label>helpful|unhelpful</label> tag)")
    label_threshold: float = Field(0.25, description="rules 'exact': helpful iff R > this, R = mean(split quality, "
                                    "share of the entropy removed) + 1 if the move named the secret (-1: no "
                                    "parseable move); 0.25 = a question that halves about half the candidates")
    context_messages: int = Field(4, ge=0, le=64, description="messages before a move that the label prompt and "
                                  "the reward model read (the move is labelled once, in its first context)")
    batch_size: int = Field(32, ge=1, description="moves per labelling batch")
    max_attempts: int = Field(3, ge=1, description="an unparseable answer is asked again up to this many times, "
                              "then the move stays unlabelled (the model's reward)")
    model: OniModelConfig = Field(default_factory=OniModelConfig, description="the refit reward model")
    wait_for_labels: bool = Field(
        True, description="true: before a round's rewards are computed, wait until every move of the rounds "
        "before is labelled and the model refit on them (the rewards are a function of the params: reproducible, "
        "resumable to the same numbers; with the rules labeller waiting costs nothing) | false: ONI's asynchronous "
        "behaviour, the round takes whatever the annotator has published (faster with a slow LLM, not "
        "reproducible)")
    wait_timeout_s: float = Field(3600.0, gt=0, description="wait_for_labels: give up (an error) after this long "
                                  "without the annotator catching up")


class RLCurriculumConfig(Section):
    """PAPRIKA's UCB curriculum (pipeline/text/curriculum.py) inside rl-text: it picks each round's tasks."""

    enabled: bool = Field(False, description="each round's rl_text.tasks_per_round tasks are the curriculum's "
                          "picks, updated by the learning potential of the policy's own rollouts of the rounds "
                          "before (needs trajectories_per_task >= 2); false = a uniform sample of train tasks")
    alpha: float = Field(1.0, ge=0.0, description="weight of the UCB exploration bonus")
    arms: Literal["difficulty", "group_difficulty"] = Field(
        "difficulty", description="difficulty: one arm per label, pooled over groups; group_difficulty: one "
        "arm per (group, label)")


class RLSamplingConfig(Section):
    """How online RL's rounds sample the policy's replies (grpo, filtered_bc), apart from evaluation's and
    rollout-text's: by default the untruncated softmax at temperature 1, as TRL and verl sample RL rounds. GRPO's
    trainer scores the temperature-scaled softmax with no truncation whatever is set here; a truncation kept here
    leaves a gap between the sampler and the trainer that grpo.rollout_correction corrects."""

    temperature: float = Field(1.0, gt=0.0, description="sampling temperature of the rounds' replies (GRPO's "
                               "trainer scores log_softmax(logits / temperature))")
    top_k: int = Field(0, ge=0, description="top-k truncation; 0 = none (the model's generation config adds none "
                       "either)")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus truncation; 1 = none")
    min_p: float = Field(0.0, ge=0.0, lt=1.0, description="min-p truncation; 0 = none")


class GRPOConfig(Section):
    """``rl_text.algorithm: grpo``: group-relative advantages over the trajectories_per_task episodes of a task
    (pipeline/text/grpo.py has the formulas)."""

    credit: Literal["trajectory", "gigpo", "turn"] = Field(
        "trajectory", description="how a step (a sampled reply) is credited; R = an episode's summed step rewards, "
        "G_t = a step's discounted return (gamma), F = scale_rewards' normaliser | trajectory: (R - mean R) / F of "
        "the task's group, for every step of the episode | gigpo: GiGPO's episode advantage plus omega x the step "
        "advantage (G_t - mean G) / F over the group's steps taken in the same state (the same conversation so "
        "far), 0 for a state no other step shared | turn: (G_t - mean G) / F over the same step index t of the "
        "group's episodes that reached it")
    scale_rewards: Literal["group", "batch", "none"] = Field(
        "group", description="F, the normaliser of the advantages (TRL's names): group = the sample std of the "
        "values compared (+1e-4) | batch = the std of all such values of the round | none = 1 (Dr. GRPO: no bias "
        "towards tasks that are too easy or too hard)")
    loss_type: Literal["dapo", "grpo", "dr_grpo"] = Field(
        "dapo", description="how token losses are averaged over an optimizer step (TRL's names): dapo = over every "
        "sampled token that can move alike | grpo = each reply's token mean, then the mean over replies | dr_grpo = "
        "the sum over "
        "tokens / (batch_size x rollout_text.max_new_tokens), a constant (Dr. GRPO); a token the rollout "
        "correction weighs 0 (mask) cannot move and counts in none")
    step_scale: Literal["none", "group"] = Field(
        "none", description="gigpo: the normaliser of the step-level advantage over a state's steps | none = "
        "(G_t - mean G), mean only (verl-agent's step-level default; a state shared by two steps would otherwise "
        "give +-0.707 for any difference) | group = / (their sample std + 1e-4)")
    omega: float = Field(1.0, ge=0, description="gigpo: the weight of the step-level advantage (GiGPO's omega)")
    gamma: float = Field(1.0, ge=0, le=1, description="gigpo and turn: the discount of the step returns G_t")
    outcome_coef: float = Field(1.0, ge=0, description="weight of the game's outcome reward among the per-turn "
                                "rewards (with a dense rl_text.reward; with outcome it is the reward)")
    format_penalty: float = Field(
        1.0, ge=0, description="a reply that does not parse as a move (re-sampled, never played) is a step of "
        "its own with reward -format_penalty, so the loss it causes lands on it (an episode that runs out of "
        "re-samples also pays its unused turns there, on turn-scored games)")
    clip_eps: float = Field(0.2, gt=0, lt=1, description="ε of the clipped importance ratio")
    beta: float = Field(0.0, ge=0, description="weight of the KL to the reference (the DPO policy); 0 = none, "
                        "and no reference model is loaded (TRL's default)")
    rollout_correction: Literal["none", "tis", "mask"] = Field(
        "tis", description="the sampler / trainer mismatch correction, rho = exp(trainer log-prob at the weights "
        "that played, from the round's no-grad scoring pass - the sampler's): tis = each token's loss x min(rho, "
        "cap) (truncated importance sampling) | mask = x rho where 1/cap <= rho <= cap, else 0 | none = weight 1 "
        "(the gap is still measured)")
    rollout_correction_level: Literal["token", "sequence"] = Field(
        "token", description="rho per token, or per reply (the product of its tokens' ratios)")
    rollout_correction_cap: float = Field(2.0, gt=1, description="C, the cap of tis and the bounds [1/C, C] of mask")
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay (TRL's default: 0)")
    epochs: int = Field(1, ge=1, le=16, description="passes over a round's replies (TRL's num_iterations)")
    batch_size: int = Field(16, ge=1, description="agent replies per optimizer step (whole episodes are taken "
                            "until a step holds at least this many)")
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping")


class RLTextConfig(Section):
    algorithm: Literal["filtered_bc", "archer", "chai", "grpo"] = Field(
        "filtered_bc", description="filtered_bc: online filtered BC | archer: hierarchical actor-critic | chai: "
        "online CHAI (critic re-ranks sampled utterances, no actor update) | grpo: group-relative policy "
        "optimisation over the task's episodes (rl_text.grpo)")
    reward: Literal["outcome", "judge", "motif", "oni", "infogain"] = Field(
        "outcome", description="the per-utterance reward the algorithm learns from: outcome = the game's (-1 per "
        "turn, 0 on the winning one; reward games: the episode's reward on its last turn; filtered_bc ranks "
        "successes first, then fewer turns) | judge = the multi-turn-aware reward of forward-simulated "
        "continuations (rl_text.judge_reward) | motif = the utterance reward model of train-reward-text "
        "(rl_text.motif) | oni = the judge labels moves while rl-text plays, a reward model refit between "
        "rounds (rl_text.oni) | infogain = each question's expected information gain (bits) over the secrets "
        "still consistent with the replies among those the task shows, from the game's knowledge base "
        "(twenty_questions, guess_my_city); "
        "filtered_bc ranks by the mean over a trajectory's utterances for all but outcome")
    judge_reward: JudgeRewardConfig = Field(default_factory=JudgeRewardConfig,
                                            description="reward judge: forward simulation and its judge")
    motif: MotifRewardConfig = Field(default_factory=MotifRewardConfig,
                                     description="reward: motif: normalised, thresholded, count-discounted")
    oni: OniTextConfig = Field(default_factory=OniTextConfig,
                               description="reward: oni: online labels of the moves and the refit reward model")
    curriculum: RLCurriculumConfig = Field(default_factory=RLCurriculumConfig,
                                           description="PAPRIKA's curriculum picks each round's tasks")
    rounds: int = Field(2, ge=0, description="rounds (iterations): rollouts, then training; the unit of resume")
    groups: list[str] | None = Field(
        None, min_length=1, description="the task groups of games.groups the rounds train and keep their val round "
        "on: null = every group (e.g. only the knowledge-base games, for reward: infogain or the rules 'exact' "
        "judge, while evaluation plays every group)")
    tasks_per_round: int = Field(64, ge=1, description="train tasks played per round")
    max_train_tasks: int | None = Field(
        None, ge=0, description="train tasks per group the rounds draw from: null = games.max_train_tasks (the "
        "tasks rollout-text played and SFT / DPO learnt); 0 = every train task (val tasks stay out); more tasks "
        "give the policy secrets it has not met")
    trajectories_per_task: int = Field(4, ge=1, description="episodes per task and round")
    val_trajectories: int = Field(
        4, ge=0, description="grpo and filtered_bc: episodes per val task (games.val_fraction) played after each "
        "round at the evaluation temperature; the model kept is the round with the best val success, the DPO "
        "policy counting as round 0 (early stopping on val); 0, or games.val_fraction 0 = no val: the last round "
        "(metric rl/kept_by_val 0)")
    max_val_tasks: int | None = Field(None, ge=1, description="grpo and filtered_bc: cap on the val tasks per "
                                      "group the rounds play (None = all; games.max_eval_tasks caps evaluation "
                                      "only)")
    top_quantile: float = Field(0.25, gt=0, le=1, description="filtered_bc: keep the best fraction of all "
                                "trajectories so far")
    lr: float = Field(1e-4, gt=0, description="filtered_bc")
    epochs: float = Field(2.0, gt=0, description="filtered_bc")
    batch_size: int = Field(16, ge=1, description="filtered_bc")
    lora: bool = Field(False, description="filtered_bc and grpo: train LoRA adapters (train_policy.lora's rank, alpha "
                       "and modules; merged after each round) instead of every weight, as train-sft and train-dpo "
                       "train: a full fine-tune at an adapter's learning rate can undo what they taught")
    critic: CriticConfig = Field(default_factory=CriticConfig,
                                 description="archer and chai: utterance-level double critic with a Polyak target")
    archer: ArcherConfig = Field(default_factory=ArcherConfig, description="archer: the token-level actor")
    chai: ChaiConfig = Field(default_factory=ChaiConfig, description="chai: the critic re-ranks sampled utterances")
    grpo: GRPOConfig = Field(default_factory=GRPOConfig, description="grpo: group-relative policy optimisation")
    sampling: RLSamplingConfig = Field(default_factory=RLSamplingConfig,
                                       description="grpo and filtered_bc: how the rounds sample the policy")

    @model_validator(mode="after")
    def _curriculum_has_spread(self) -> RLTextConfig:
        if self.curriculum.enabled and self.trajectories_per_task < 2:
            raise ValueError("curriculum.enabled: the curriculum reads a task's learning potential from the "
                             "spread of its scores; set rl_text.trajectories_per_task >= 2")
        return self


class EvaluateTextConfig(Section):
    trajectories_per_task: int = Field(8, ge=1, description="episodes per held-out task and policy "
                                       "(52 held-out secrets x 8 = 416 episodes per policy)")
    temperature: float = Field(0.7, ge=0.0, description="sampling temperature while evaluating")
    policies: list[Literal["base", "sft", "dpo", "rl"]] = Field(list(POLICIES), min_length=1,
        description="policies evaluated: base (bootstrap or policy.model), sft, dpo, rl")


class EvalSweepConfig(Section):
    checkpoints: list[str] = Field(["base", "sft", "dpo", "rl"], min_length=1,
                                   description="policy names (base, sft, dpo, rl) or model paths")
    splits: list[Literal["train", "val", "eval"]] = Field(["eval"], min_length=1,
        description="task splits: train, val (games.val_fraction > 0) or eval")
    seeds: list[int] = Field([0, 1], min_length=1, description="sampling seeds; results report mean and std over them")
    groups: list[str] | None = Field(None, min_length=1, description="task groups, one results row each "
                                     "(null = the evaluation groups: games.eval_groups, else games.groups)")
    max_workers: int = Field(2, ge=1, description="evaluations run in parallel")


#: The rules programs each LLM role accepts (others: the programs registered in ``pipeline.llm.rules``).
RULES_MODELS = {
    "rollout_text.environment": ("oracle",),
    "annotate_text.judge": ("exact_match",),
    "pairs_text.judge": MULTITURN_RULES_JUDGES,
    "rl_text.judge_reward.judge": MULTITURN_RULES_JUDGES,
    "annotate_utterances.judge": MULTITURN_RULES_JUDGES,
    "rl_text.oni.annotator": MULTITURN_RULES_JUDGES,
}
