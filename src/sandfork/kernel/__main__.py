"""``python -m sandfork.kernel -f {connection_file}``."""

from sandfork.kernel.app import main

main()
