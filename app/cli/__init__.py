"""The `voxmux` command (`app.cli.main`). `entry` is what the installed command runs: a Ctrl-C
while the command is still importing (a second or two) ends it with one line, as later."""

from __future__ import annotations

import sys


def entry() -> None:
    try:
        from app.cli.main import main
    except KeyboardInterrupt:
        sys.stderr.write("voxmux: interrupted\n")
        raise SystemExit(130) from None
    main()
