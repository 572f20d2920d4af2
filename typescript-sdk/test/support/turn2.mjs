// Turn 2 of document 000, in another process: restore the snapshot id given as argument.
import { Sandbox } from "@sandfork/sdk";

const sandbox = await Sandbox.create({
  template: "code-interpreter",
  fromSnapshot: process.argv[2],
});
try {
  const ctx = await sandbox.createCodeContext();
  const ex = await ctx.runCode("print(SUMMARY.loc['mean', 'a']); int(df.shape[0])");
  const setup = await sandbox.files.read("/root/setup.txt");
  console.log(JSON.stringify({ text: ex.text, stdout: ex.stdout, setup, sandboxId: sandbox.id }));
} finally {
  await sandbox[Symbol.asyncDispose]();
}
