"""check-params: every param checked before any stage runs (see pipeline/params_check.py)."""

from __future__ import annotations

from pipeline.core.config import SHARED_KEYS
from pipeline.core.stage import Out, Stage
from pipeline.params import Params
from pipeline.params_check import NAME, STAMP

STAGE = Stage(
    NAME,
    params=[k for k in Params.model_fields if k not in SHARED_KEYS],  # every section (shared keys: all stages')
    cmd="curio check-params",
    code=["pipeline/params_check.py"],
    outs=[Out(STAMP, persist=True, note="the same bytes whenever the params pass: no stage reruns for it")],
    track="params",
    doc=("Checks every param (pipeline/params_check.py) before DVC removes any stage's outputs: every stage depends "
         "on its stamp, so a refused value costs nothing."),
)
