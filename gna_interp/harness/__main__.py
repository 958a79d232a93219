"""``python -m gna_interp.harness ARGS``: lm-eval's CLI with the ``gna`` model (see `cli`)."""

from .cli import main

raise SystemExit(main())
