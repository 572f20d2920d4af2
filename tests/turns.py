"""The two turns of the snapshot product document, each run as its own process.

    python turns.py [--pandastack] turn1   -> prints the snapshot id
    python turns.py [--pandastack] turn2 ID -> prints what turn 2 finds, as JSON

Both find the engine through SANDFORK_API / SANDFORK_API_KEY, or, with ``--pandastack`` (the
published PandaStack SDK instead of Sandfork's), PANDASTACK_API / PANDASTACK_API_KEY.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from sandfork import Sandbox as SandforkSandbox

Sandbox: Any = SandforkSandbox

TURN2_FINDS = {  # what turn 2 prints when turn 1's kernel, memory and disk came back
    "rows": "100000",
    "stdout": "24999.75\n",
    "error": None,
    "kernel_tabulate": "'0.9.0'",
    "exec_tabulate": "0.9.0",
}


def turn1() -> None:
    sandbox = Sandbox.create(template="code-interpreter")
    sandbox.exec("pip install --quiet tabulate==0.9.0", check=True, timeout_seconds=300)
    ctx = sandbox.create_code_context()
    setup = ctx.run_code(
        "import numpy as np, pandas as pd\n"
        "df = pd.DataFrame({'units': np.arange(100_000) % 7, 'price': np.arange(100_000) * 0.5})\n"
        "SUMMARY = df.describe()\n"
    )
    assert setup.error is None, setup.error
    snapshot = sandbox.snapshot()
    snapshot_id = snapshot if isinstance(snapshot, str) else snapshot.id  # PandaStack's: an id
    sandbox.kill()
    print(snapshot_id)


def turn2(snapshot_id: str) -> None:
    sandbox = Sandbox.create(template="code-interpreter", from_snapshot=snapshot_id)
    ctx = sandbox.create_code_context()
    ex = ctx.run_code("print(SUMMARY.loc['mean', 'price']); int(df.shape[0])")
    imported = ctx.run_code("import tabulate; tabulate.__version__")
    cli = sandbox.exec("python3 -c 'import tabulate; print(tabulate.__version__)'")
    sandbox.kill()
    print(
        json.dumps(
            {
                "rows": ex.text,
                "stdout": ex.stdout,
                "error": str(ex.error) if ex.error else None,
                "kernel_tabulate": imported.text,
                "exec_tabulate": cli.stdout.strip(),
            }
        )
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[0] == "--pandastack":
        import pandastack

        Sandbox = pandastack.Sandbox
        args = args[1:]
    if args[0] == "turn1":
        turn1()
    else:
        turn2(args[1])
