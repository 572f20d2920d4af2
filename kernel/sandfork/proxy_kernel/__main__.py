"""``python -m sandfork.proxy_kernel -f {connection_file}``."""

from sandfork.proxy_kernel.app import main

main()
