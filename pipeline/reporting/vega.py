"""An offline HTML template for ``dvc plots show``: Vega, Vega-Lite and Vega-Embed inlined from the npm registry.

DVC's default page loads the three libraries from a CDN, so without network every Vega plot (the learning
curves) is blank. ``make plots-offline`` (part of ``make install``) runs
``npm install --prefix .cache/vega vega@5 vega-lite@5 vega-embed@6`` and then this module, which writes
``.cache/vega/dvc_plots.html`` and points ``dvc config --local plots.html_template`` at it. The page DVC writes
(``dvc_plots/index.html``) is then one self-contained file. Nothing is vendored into the repository.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(".cache/vega")
LIBRARIES = ("vega/build/vega.min.js", "vega-lite/build/vega-lite.min.js", "vega-embed/build/vega-embed.min.js")

PAGE = """<!DOCTYPE html>
<html>
<head>
  <meta charset="utf-8">
  {refresh_tag}
  <title>DVC plots</title>
  SCRIPTS
  <style>table { border-spacing: 15px; } body { font-family: sans-serif; }</style>
</head>
<body>
  {plot_divs}
</body>
</html>
"""


def build(root: Path = ROOT) -> Path:
    """Write the template (inlined libraries; no ``{scripts}`` placeholder, so DVC's CDN tags are dropped)."""
    modules = root / "node_modules"
    missing = [lib for lib in LIBRARIES if not (modules / lib).exists()]
    if missing:
        raise FileNotFoundError(f"{modules}: {', '.join(missing)} missing (run `make plots-offline`)")
    # "</script" inside a library would end the inline element early; escaping it keeps the JS identical.
    scripts = "\n".join(
        "<script>" + (modules / lib).read_text(encoding="utf8").replace("</script", "<\\/script") + "</script>"
        for lib in LIBRARIES
    )
    out = root / "dvc_plots.html"
    page = PAGE.replace("SCRIPTS", scripts)
    out.write_text(page, encoding="utf8")
    return out


def main() -> int:
    out = build()
    # Relative to .dvc/ (how DVC resolves a relative plots.html_template); --local: the file is per checkout.
    subprocess.run(["dvc", "config", "--local", "plots.html_template", str(Path("..") / out)], check=True)
    print(f"dvc plots show: offline template {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
