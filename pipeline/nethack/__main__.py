"""``python -m pipeline.nethack [sample-factory args]``: train APPO on a Curio NetHack task (see sf.py)."""

import sys

from pipeline.nethack.sf import main

if __name__ == "__main__":  # sample-factory's spawned workers re-import this module as __mp_main__
    from pipeline.nethack.clock import preload

    preload()  # started by hand, not from `curio`: NetHack's clock pinned all the same
    sys.exit(main())
