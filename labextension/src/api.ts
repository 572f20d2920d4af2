/**
 * The REST API of Sandfork's Jupyter server extension (docs/jupyter-api.md), under the
 * server's base URL at `sandfork/api/`.
 */
import { URLExt } from '@jupyterlab/coreutils';
import type * as nbformat from '@jupyterlab/nbformat';
import { ServerConnection, Session } from '@jupyterlab/services';

/** A checkpoint is taken after a cell by the kernel; a snapshot, on request. */
export type SnapshotKind = 'checkpoint' | 'snapshot';

export interface ISnapshot {
  id: string;
  kind: SnapshotKind;
  name: string | null;
  created_at: string;
  size_bytes: number;
  paused_ms: number;
  memory_mb: number;
  /** The sandbox it was taken of. */
  sandbox_id: string;
  /** The snapshot that sandbox was restored from. */
  parent_id: string | null;
  notebook_path: string | null;
  kernel_id: string | null;
  /** The cell after which a checkpoint was taken (its model id), and its execution count. */
  cell_id: string | null;
  execution_count: number | null;
  /** The checkpoint lineage of the kernel that took a checkpoint (`IKernelSandbox.lineage`). */
  lineage: string | null;
  /** Whether `snapshots/{id}/inventory` can list its variables. */
  has_inventory: boolean;
}

export interface ISandbox {
  id: string;
  /** "running", "hibernated" (its VM is stopped), "waking", "gone", … */
  status: string;
  /** Null for a sandbox that is gone. */
  created_at: string | null;
  /** Restored from this snapshot. */
  from_snapshot: string | null;
  /** A fork (branch) of this sandbox. */
  forked_from: string | null;
  notebook_path: string | null;
  /** The live kernel of this server attached to it, if any. */
  kernel_id: string | null;
}

export interface IListing {
  /** Newest first. */
  snapshots: ISnapshot[];
  sandboxes: ISandbox[];
}

export interface IKernelSandbox {
  kernel_id: string;
  context: string;
  /** The id its checkpoints carry (`ISnapshot.lineage`), across the sandboxes it moves to. */
  lineage: string;
  /** Whether the kernel takes a checkpoint after every cell now. */
  checkpoints: boolean;
  sandbox: {
    id: string;
    template: string;
    status: string;
    /** What separates it from the host: 'vm' or 'container'. */
    isolation: string;
    accelerator: string;
    memory_mb: number;
    cpu: number;
    from_snapshot: string | null;
  };
}

/** A variable of a snapshot's kernel, as its inventory describes it. */
export interface IVariable {
  name: string;
  type: string;
  /** An array's dimensions. */
  shape: number[] | null;
  /** A container's length. */
  length: number | null;
  bytes: number | null;
  /** Equal fingerprints: equal values. */
  fingerprint: string | null;
}

/** The variables of a snapshot: `GET snapshots/{id}/inventory`. */
export interface IInventory {
  status: 'ok' | 'unavailable';
  /** Why it is unavailable. */
  reason: string | null;
  /** Whether some variables were left out. */
  truncated: boolean;
  elapsed_ms: number;
  variables: IVariable[];
}

/** What changed between two snapshots' variables: `GET snapshots/{from}/diff/{to}`. */
export interface IInventoryDiff {
  from: string;
  to: string;
  added: IVariable[];
  removed: IVariable[];
  changed: { name: string; before: IVariable; after: IVariable }[];
  unchanged: string[];
}

/** A notebook the server made, with a session whose kernel is attached to its sandbox. */
export interface IOpenedNotebook {
  path: string;
  sandbox_id: string;
  kernel_id: string;
  session: Session.IModel;
}

export interface IOperation {
  id: string;
  title: string;
  step: string;
  done: number;
  total: number;
  state: 'running' | 'done' | 'failed';
  error?: string;
}

/** The server's side of the configuration: `GET sandfork/api/config`. */
export interface IServerConfig {
  /** Most branch notebooks one fork may open (`SandforkExtension.max_branches`). */
  max_branches: number;
  /** The kernelspecs that are Sandfork kernels (the server's `is_sandfork_spec`). */
  kernel_names: string[];
}

/** What snapshot and fork send: the notebook as the front end holds it, unsaved edits included. */
export interface INotebookState {
  kernel_id: string;
  path: string;
  notebook: nbformat.INotebookContent;
}

/** A server listening in a kernel's sandbox, and where this Jupyter server serves it. */
export interface IPort {
  port: number;
  url: string;
}

export interface IKernelPorts {
  sandbox_id: string;
  ports: IPort[];
}

/** A failed call, with the server's message (meant to be shown as is). */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string
  ) {
    super(message);
  }
}

async function request<T>(path: string, method = 'GET', body?: object): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'sandfork', 'api', path);
  const init: RequestInit = { method };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers = { 'Content-Type': 'application/json' };
  }
  const response = await ServerConnection.makeRequest(url, init, settings);
  if (!response.ok) {
    const data = await response.json().catch(() => ({}));
    const message =
      typeof data.message === 'string' && data.message
        ? data.message
        : `${response.status} ${response.statusText}`;
    throw new ApiError(response.status, message);
  }
  return response.status === 204 ? (undefined as T) : ((await response.json()) as T);
}

const quote = encodeURIComponent;

export function getServerConfig(): Promise<IServerConfig> {
  return request('config');
}

export function getKernelSandbox(kernelId: string): Promise<IKernelSandbox> {
  return request(`kernels/${quote(kernelId)}`);
}

export function getKernelPorts(kernelId: string): Promise<IKernelPorts> {
  return request(`kernels/${quote(kernelId)}/ports`);
}

export function listSnapshots(): Promise<IListing> {
  return request('snapshots');
}

export function getInventory(id: string): Promise<IInventory> {
  return request(`snapshots/${quote(id)}/inventory`);
}

export function getInventoryDiff(from: string, to: string): Promise<IInventoryDiff> {
  return request(`snapshots/${quote(from)}/diff/${quote(to)}`);
}

export function createSnapshot(
  state: INotebookState,
  name: string | null,
  operation: string
): Promise<ISnapshot> {
  return request('snapshots', 'POST', { ...state, operation, ...(name ? { name } : {}) });
}

export function renameSnapshot(id: string, name: string): Promise<ISnapshot> {
  return request(`snapshots/${quote(id)}`, 'PATCH', { name });
}

export function deleteSnapshot(id: string): Promise<void> {
  return request(`snapshots/${quote(id)}`, 'DELETE');
}

export function restoreSnapshot(id: string, operation: string): Promise<IOpenedNotebook> {
  return request(`snapshots/${quote(id)}/restore`, 'POST', { operation });
}

export async function createForks(
  state: INotebookState,
  count: number,
  operation: string
): Promise<IOpenedNotebook[]> {
  const reply = await request<{ branches: IOpenedNotebook[] }>('forks', 'POST', {
    ...state,
    count,
    operation
  });
  return reply.branches;
}

export function getOperation(id: string): Promise<IOperation> {
  return request(`operations/${quote(id)}`);
}
