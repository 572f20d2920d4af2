"""Sandfork guest agent: serves exec, files and Jupyter code contexts to the host engine.

Inside the guest this package is installed as ``sandfork_agent`` and started with
``python -m sandfork_agent``; on the host it imports as ``sandfork.agent``. It only uses the
standard library, plus ``jupyter_client`` (imported lazily) for code contexts.
"""

__version__ = "0.1.0"
