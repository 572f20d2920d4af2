/** `@sandfork/sdk`: the TypeScript SDK of Sandfork. */

export { Client, ExecCall, SandboxHandle, memoryMb } from "./client.js";
export type { Resources, SandboxSpec, Sink } from "./client.js";
export {
  fromEnvironment,
  localEngine,
  resolveConnection,
  startLocalEngine,
  stateDir,
} from "./config.js";
export type { Connection } from "./config.js";
export {
  AuthError,
  BadRequestError,
  CommandFailed,
  ConflictError,
  LimitExceeded,
  NotFoundError,
  ReplayMismatch,
  SandforkError,
  ServerError,
  TimeoutError,
} from "./errors.js";
export { explore } from "./explore.js";
export type {
  Candidate,
  CandidateReport,
  ExploreOptions,
  ExploreResult,
  Outcome,
  ScoreFn,
} from "./explore.js";
export { Http, defaultHttp } from "./http.js";
export type { ConnectionOptions } from "./http.js";
export {
  INVENTORY_ATTACHMENT,
  diffInventories,
  inventoryFromApi,
  missingInventory,
  sameVariable,
  unavailableInventory,
} from "./inventory.js";
export type { Inventory, InventoryDiff, Variable, VariableChange } from "./inventory.js";
export { Execution } from "./models.js";
export type { ExecResult, ExecutionError, FileEntry, Result, SnapshotInfo } from "./models.js";
export { ReplayCache } from "./replay.js";
export type { LedgerEntry } from "./replay.js";
export { CodeContext, Files } from "./files.js";
export { Sandbox } from "./sandbox.js";
export type {
  CheckpointInfo,
  CreateOptions,
  ExecOptions,
  ExecStreamOptions,
  ForkOptions,
  PromoteResult,
} from "./sandbox.js";
export { inventoryDiff, snapshotInventory } from "./snapshots.js";
export { SandboxBuilder, Workflow, WorkflowFailed, workflow } from "./workflow.js";
export type { SandboxRun, StepResult, WorkflowResult } from "./workflow.js";
