// Turn 1 of document 000, in a process of its own: set up, snapshot, print the id, kill.
import { Sandbox } from "@sandfork/sdk";

const sandbox = await Sandbox.create({ template: "code-interpreter" });
try {
  await sandbox.exec("echo installed > /root/setup.txt", { check: true });
  const ctx = await sandbox.createCodeContext();
  const setup = await ctx.runCode(`
import pandas as pd
df = pd.DataFrame({'a': range(10)})
SUMMARY = df.describe()
`);
  if (setup.error) throw new Error(`turn 1 failed: ${setup.error.name}: ${setup.error.value}`);
  const info = await sandbox.snapshot("turn-1");
  console.log(
    JSON.stringify({
      sandboxId: sandbox.id,
      snapshotId: info.id,
      name: info.name,
      sizeBytes: info.sizeBytes,
      createdAt: info.createdAt.toISOString(),
    }),
  );
} finally {
  await sandbox.kill();
}
