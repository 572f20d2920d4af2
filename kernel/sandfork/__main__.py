"""``python -m sandfork`` runs the CLI."""

from sandfork.cli import main

raise SystemExit(main())
