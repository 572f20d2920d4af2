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
  ERROR_CLASSES,
  EngineUnreachable,
  LimitExceeded,
  NotFoundError,
  ReplayMismatch,
  SandforkError,
  ServerError,
  TimeoutError,
  errorFor,
  kindOf,
} from "./errors.js";
export { explore } from "./explore.js";
export type {
  Candidate,
  CandidateReport,
  Explorable,
  ExploreFork,
  ExploreOptions,
  ExploreResult,
  Outcome,
  ScoreFn,
} from "./explore.js";
export { Http, defaultHttp } from "./http.js";
export type { ClientOption, ConnectionOptions } from "./http.js";
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
export type {
  CamelCase,
  CamelFields,
  ExecResult,
  ExecutionError,
  FileEntry,
  Result,
  WireFields,
  WireObject,
} from "./models.js";
export { ReplayCache } from "./replay.js";
export type { LedgerEntry } from "./replay.js";
export { Files } from "./files.js";
export * as routes from "./routes.js";
export { CodeContext, Sandbox } from "./sandbox.js";
export type {
  CheckpointInfo,
  CreateOptions,
  ExecOptions,
  ExecStreamOptions,
  ForkOptions,
  PromoteResult,
  SnapshotOptions,
} from "./sandbox.js";
export { Snapshot, inventoryDiff, snapshotInventory } from "./snapshot.js";
export type { ListSnapshotsOptions, SnapshotRef } from "./snapshot.js";
export { SandboxBuilder, Workflow, WorkflowFailed, workflow } from "./workflow.js";
export type { SandboxRun, StepResult, WorkflowResult } from "./workflow.js";
// The wire's types, enums and limits, generated from wire-schema.json (SandboxInfo,
// SnapshotInfo, SandboxStatus, ErrorKind, LIMITS, …): a new one is exported as it comes.
export * from "./wire.js";
