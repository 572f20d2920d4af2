/**
 * The workflow builder: sandboxes whose steps (exec, checkpoint, writeFile, runCode) are
 * declared in a callback, run in sequence or in parallel. When a run fails, running the same
 * workflow again resumes each failed sandbox from its last checkpoint: the steps before the
 * checkpoint are replayed from the ledger (their recorded output, nothing runs), the
 * steps after it run live.
 */

import { type Client, type SandboxHandle, type SandboxSpec, type Sink } from "./client.js";
import { CommandFailed, SandforkError } from "./errors.js";
import type { ExecResult, Execution } from "./models.js";
import type { CheckpointInfo, ExecOptions } from "./sandbox.js";

type Step =
  | { kind: "exec"; cmd: string; options: ExecOptions }
  | { kind: "checkpoint"; name?: string }
  | { kind: "writeFile"; path: string; content: string | Uint8Array }
  | { kind: "runCode"; code: string };

/** Declares the steps of one sandbox; nothing runs while the callback does. */
export class SandboxBuilder {
  /** The steps, in order. */
  readonly steps: Step[] = [];

  /** A shell command; a non-zero exit fails the workflow. */
  exec(cmd: string, options: ExecOptions = {}): this {
    this.steps.push({ kind: "exec", cmd, options });
    return this;
  }

  /** A checkpoint: a failed run resumes from the last one reached. */
  checkpoint(name?: string): this {
    this.steps.push({ kind: "checkpoint", name });
    return this;
  }

  /** Write a file in the sandbox. */
  writeFile(path: string, content: string | Uint8Array): this {
    this.steps.push({ kind: "writeFile", path, content });
    return this;
  }

  /** Python code for the default code context; an exception fails the workflow. */
  runCode(code: string): this {
    this.steps.push({ kind: "runCode", code });
    return this;
  }
}

/** What one step did; `replayed` when it was answered from the ledger or the checkpoint. */
export interface StepResult {
  index: number;
  kind: Step["kind"];
  replayed: boolean;
  result?: ExecResult | Execution | CheckpointInfo;
}

/** One sandbox's run: its id, the sandbox it resumed, and its steps. */
export interface SandboxRun {
  name?: string;
  sandboxId: string;
  resumedFrom?: string;
  steps: StepResult[];
}

/** The result of a workflow run: each sandbox's run, in declaration order. */
export interface WorkflowResult {
  sandboxes: SandboxRun[];
}

/** A step failed; `sandboxId` is the (closed) sandbox, resumable from its checkpoint. */
export class WorkflowFailed extends SandforkError {
  constructor(
    message: string,
    readonly sandboxId: string,
    readonly step: number,
    override readonly cause: unknown,
  ) {
    super(message);
  }
}

interface SandboxNode {
  type: "sandbox";
  spec: SandboxSpec;
  build: (sb: SandboxBuilder) => void;
  /** The last checkpoint a failed run reached: resumed by the next run. */
  resumePoint?: { sandboxId: string; step: number };
}

interface GroupNode {
  type: "group";
  parallel: boolean;
  children: WorkflowNode[];
}

type WorkflowNode = SandboxNode | GroupNode;

/** A workflow; build it with `.sandbox()`, `.sequence()`, `.parallel()`, run it with
 * `.result()` or `.pipe(stream)`. Its nodes run in sequence unless in `.parallel()`. */
export class Workflow {
  private readonly root: GroupNode = { type: "group", parallel: false, children: [] };

  constructor(private readonly client: Client) {}

  /** A sandbox created from `spec`, whose steps `build` declares, closed at its end. */
  sandbox(spec: SandboxSpec, build: (sb: SandboxBuilder) => void): this {
    this.root.children.push({ type: "sandbox", spec, build });
    return this;
  }

  /** A group whose nodes run one after the other. */
  sequence(build: (w: Workflow) => void): this {
    return this.group(false, build);
  }

  /** A group whose nodes run at the same time. */
  parallel(build: (w: Workflow) => void): this {
    return this.group(true, build);
  }

  private group(parallel: boolean, build: (w: Workflow) => void): this {
    const inner = new Workflow(this.client);
    build(inner);
    this.root.children.push({ ...inner.root, parallel });
    return this;
  }

  /** Run the workflow, streaming every exec's output into `stream`. */
  pipe(stream: Sink): Promise<WorkflowResult> {
    return this.run(stream);
  }

  /** Run the workflow. */
  result(): Promise<WorkflowResult> {
    return this.run(undefined);
  }

  private async run(stream: Sink | undefined): Promise<WorkflowResult> {
    const sandboxes: SandboxRun[] = [];
    await this.runNode(this.root, stream, sandboxes);
    return { sandboxes };
  }

  private async runNode(
    node: WorkflowNode,
    stream: Sink | undefined,
    out: SandboxRun[],
  ): Promise<void> {
    if (node.type === "sandbox") {
      out.push(await this.runSandbox(node, stream));
      return;
    }
    if (!node.parallel) {
      for (const child of node.children) await this.runNode(child, stream, out);
      return;
    }
    const runs = node.children.map(() => [] as SandboxRun[]);
    const settled = await Promise.allSettled(
      node.children.map((child, i) => this.runNode(child, stream, runs[i])),
    );
    out.push(...runs.flat());
    const failed = settled.find((s): s is PromiseRejectedResult => s.status === "rejected");
    if (failed) throw failed.reason;
  }

  private async runSandbox(node: SandboxNode, stream: Sink | undefined): Promise<SandboxRun> {
    const builder = new SandboxBuilder();
    node.build(builder);
    const resume = node.resumePoint;
    const handle = resume
      ? await this.client.resume(resume.sandboxId)
      : await this.client.sandbox(node.spec);
    const replayUpTo = resume?.step ?? -1;
    const run: SandboxRun = {
      name: node.spec.name,
      sandboxId: handle.sandboxId,
      resumedFrom: resume?.sandboxId,
      steps: [],
    };
    let index = 0;
    try {
      for (; index < builder.steps.length; index++) {
        const step = builder.steps[index];
        const result = await runStep(handle, step, index <= replayUpTo, stream);
        run.steps.push({ index, kind: step.kind, ...result });
        if (step.kind === "checkpoint" && !result.replayed) {
          node.resumePoint = { sandboxId: handle.sandboxId, step: index };
        }
      }
    } catch (e) {
      throw new WorkflowFailed(
        `workflow step #${index} of sandbox ${handle.sandboxId} failed: ${(e as Error).message}`,
        handle.sandboxId,
        index,
        e,
      );
    } finally {
      await handle.close();
    }
    node.resumePoint = undefined;
    return run;
  }
}

async function runStep(
  handle: SandboxHandle,
  step: Step,
  beforeResumePoint: boolean,
  stream: Sink | undefined,
): Promise<Omit<StepResult, "index" | "kind">> {
  switch (step.kind) {
    case "exec": {
      const call = handle.exec(step.cmd, step.options);
      const result = await (stream ? call.pipe(stream) : call);
      if (result.exitCode !== 0) throw new CommandFailed(step.cmd, result);
      return { replayed: result.replayed, result };
    }
    case "runCode": {
      const execution = await handle.runCode(step.code);
      if (execution.error) {
        throw new SandforkError(`${execution.error.name}: ${execution.error.value}`);
      }
      if (stream && execution.stdout) stream.write(execution.stdout);
      return { replayed: execution.replayed, result: execution };
    }
    case "checkpoint":
      // Before the resume point the checkpoint is the state the sandbox was restored from.
      if (beforeResumePoint) return { replayed: true };
      return { replayed: false, result: await handle.checkpoint(step.name) };
    case "writeFile":
      // Before the resume point, the file is in the restored checkpoint already.
      if (beforeResumePoint) return { replayed: true };
      await handle.writeFile(step.path, step.content);
      return { replayed: false };
  }
}

/** A workflow on `client`: `workflow(client).sandbox(spec, sb => {...}).pipe(process.stdout)`. */
export function workflow(client: Client): Workflow {
  return new Workflow(client);
}
