"""Every stage's params hash, for params.yaml and each preset: what decides whether DVC and the stages' resume
consider a finished stage current (``curio params-hashes``). Run it before and after a change to the params schema
and diff the two:

    curio params-hashes > before.json   # ... change the schema ...
    curio params-hashes > after.json && diff before.json after.json

Per stage: ``params.section_hash(STAGE.params)`` (what ``pipeline.core.stage.execute`` records as
``curio.params_hash``), the same hash computed on the stage's slice, and a digest of the slice's values; then a
digest of the whole schema (JSON schema: names, types, bounds, help strings) and of the defaults.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pipeline.core.config import preset_overrides
from pipeline.generate import declared_stages
from pipeline.params import load_params


def digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def params_hashes(params_file: Path = Path("params.yaml"), presets: Path = Path("presets")) -> dict:
    """Label:stage -> its hashes, for ``params_file`` and every preset under ``presets``; then the schema's and the
    defaults' digests."""
    out: dict = {}
    configs = {"params.yaml": [], **{p.name: preset_overrides(p) for p in sorted(presets.glob("*.yaml"))}}
    stages = declared_stages()
    for label, overrides in configs.items():
        params = load_params(params_file, overrides)
        for stage in stages:
            view = stage.slice(params)
            out[f"{label}:{stage.name}"] = {"hash": params.section_hash(stage.params),
                                            "slice_hash": view.section_hash(stage.params),
                                            "values": digest(view.model_dump(mode="json"))[:16]}
    defaults = load_params(params_file)
    out["schema"] = digest(type(defaults).model_json_schema())
    out["defaults"] = digest(defaults.model_dump(mode="json"))
    return out
