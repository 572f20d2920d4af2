"""The proxy Jupyter kernel "Python 3 (Sandfork)": a kernel whose cells run in a sandbox.

Jupyter launches it like any kernel (``python -m sandfork.proxy_kernel -f {connection_file}``); it
binds the connection file's ZMQ sockets and relays every message, re-signed, to a code context
of a sandbox over the engine's WebSocket channels.
"""
