import {
  Clipboard,
  Dialog,
  InputDialog,
  Notification,
  showDialog,
  showErrorMessage
} from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import type * as nbformat from '@jupyterlab/nbformat';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISignal, Signal } from '@lumino/signaling';

import {
  INotebookState,
  IOpenedNotebook,
  ISandbox,
  ISnapshot,
  createForks,
  createSnapshot,
  deleteSnapshot,
  listSnapshots,
  renameSnapshot,
  restoreSnapshot
} from './api';
import { SandforkConfig } from './config';
import { formatTime } from './format';
import { errorMessage, withProgress } from './progress';

/** How a snapshot is named in dialogs and notifications. */
export function snapshotLabel(snapshot: ISnapshot): string {
  return snapshot.name ? `${snapshot.name} (${snapshot.id})` : snapshot.id;
}

/** Asks the user to go ahead with `action` (a warning button) or cancel. */
async function confirm(title: string, body: string, action: string): Promise<boolean> {
  const answer = await showDialog({
    title,
    body,
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: action })]
  });
  return answer.button.accept;
}

/**
 * What the toolbar buttons, the commands and the side panel do: each asks what it needs,
 * calls the server with progress, opens the notebooks it made and tells `changed`.
 */
export class SandforkActions {
  constructor(
    private readonly docManager: IDocumentManager,
    private readonly tracker: INotebookTracker,
    private readonly config: SandforkConfig
  ) {}

  /** Emitted after every operation that changed snapshots or sandboxes. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Snapshots the notebook's sandbox, with the notebook as it is in the browser. */
  async snapshot(state: INotebookState): Promise<void> {
    const answer = await InputDialog.getText({
      title: 'Snapshot',
      label: `Snapshot the sandbox of ${state.path}. Name (optional):`,
      placeholder: 'e.g. before-training',
      okLabel: 'Snapshot'
    });
    if (!answer.button.accept) {
      return;
    }
    const name = (answer.value ?? '').trim() || null;
    const snapshot = await withProgress(
      `Snapshot of ${state.path}`,
      operation => createSnapshot(state, name, operation),
      taken => `Snapshot ${snapshotLabel(taken)} taken`
    );
    if (snapshot) {
      this._changed.emit();
    }
  }

  /** Lets the user pick a snapshot (those of `path` first), then restores it. */
  async chooseAndRestore(path: string | null): Promise<void> {
    let snapshots: ISnapshot[];
    try {
      snapshots = (await listSnapshots()).snapshots;
    } catch (error) {
      await showErrorMessage('Cannot list the snapshots', errorMessage(error));
      return;
    }
    if (snapshots.length === 0) {
      Notification.info('There is no snapshot yet: take one with Snapshot.', { autoClose: 5000 });
      return;
    }
    const labels = snapshots.map(
      s => `${snapshotLabel(s)} · ${formatTime(s.created_at)} · ${s.notebook_path ?? 'no notebook'}`
    );
    const own = snapshots.findIndex(s => s.notebook_path === path);
    const answer = await InputDialog.getItem({
      title: 'Restore snapshot',
      label: 'Restore into a new notebook:',
      items: labels,
      current: Math.max(own, 0),
      okLabel: 'Restore'
    });
    const index = answer.value === null ? -1 : labels.indexOf(answer.value);
    if (answer.button.accept && index >= 0) {
      await this.restore(snapshots[index]);
    }
  }

  /** Restores a snapshot into a new notebook on a new kernel, and opens it. */
  async restore(snapshot: ISnapshot): Promise<void> {
    const restored = await withProgress(
      `Restoring ${snapshotLabel(snapshot)}`,
      operation => restoreSnapshot(snapshot.id, operation),
      made => `Restored ${snapshot.id} into ${made.path}`
    );
    if (restored) {
      this._changed.emit();
      this.open([restored]);
    }
  }

  /** Forks the notebook's sandbox into branch notebooks, and opens them. */
  async fork(state: INotebookState): Promise<void> {
    const limit = this.config.maxBranches;
    if (limit < 1) {
      await showErrorMessage('Cannot fork', 'The server allows no branch notebooks.');
      return;
    }
    const answer = await InputDialog.getItem({
      title: 'Fork',
      label: `Fork the sandbox of ${state.path} into how many branch notebooks?`,
      items: Array.from({ length: limit }, (_, i) => String(i + 1)),
      current: 0,
      okLabel: 'Fork'
    });
    if (!answer.button.accept || answer.value === null) {
      return;
    }
    const count = Number(answer.value);
    if (
      count > this.config.confirmForkAbove &&
      !(await confirm(
        'Fork',
        `Fork ${state.path} into ${count} branch notebook${count === 1 ? '' : 's'}? ` +
          'Each runs in a sandbox of its own.',
        'Fork'
      ))
    ) {
      return;
    }
    const branches = await withProgress(
      `Forking ${state.path}`,
      operation => createForks(state, count, operation),
      made => `Forked into ${made.map(b => b.path).join(', ')}`
    );
    if (branches) {
      this._changed.emit();
      this.open(branches);
    }
  }

  /** Forks a live sandbox of the tree: through its open notebook, else its saved file. */
  async forkSandbox(sandbox: ISandbox): Promise<void> {
    if (sandbox.kernel_id === null || sandbox.notebook_path === null) {
      return;
    }
    const panel = this.tracker.find(
      p => p.sessionContext.session?.kernel?.id === sandbox.kernel_id
    );
    const open = this.config.kernels.notebookState(panel);
    if (open) {
      return this.fork(open);
    }
    try {
      const file = await this.docManager.services.contents.get(sandbox.notebook_path, {
        type: 'notebook',
        content: true
      });
      await this.fork({
        kernel_id: sandbox.kernel_id,
        path: sandbox.notebook_path,
        notebook: file.content as nbformat.INotebookContent
      });
    } catch (error) {
      await showErrorMessage(`Cannot read ${sandbox.notebook_path}`, errorMessage(error));
    }
  }

  async rename(snapshot: ISnapshot): Promise<void> {
    const answer = await InputDialog.getText({
      title: 'Rename snapshot',
      label: `New name of ${snapshot.id}:`,
      text: snapshot.name ?? '',
      okLabel: 'Rename'
    });
    const name = (answer.value ?? '').trim();
    if (!answer.button.accept || !name || name === snapshot.name) {
      return;
    }
    try {
      await renameSnapshot(snapshot.id, name);
    } catch (error) {
      await showErrorMessage('Rename failed', errorMessage(error));
    }
    this._changed.emit();
  }

  async remove(snapshot: ISnapshot): Promise<void> {
    if (
      this.config.confirmDelete &&
      !(await confirm(
        'Delete snapshot',
        `Delete ${snapshotLabel(snapshot)}? Sandboxes restored from it are kept.`,
        'Delete'
      ))
    ) {
      return;
    }
    try {
      await deleteSnapshot(snapshot.id);
    } catch (error) {
      await showErrorMessage('Delete failed', errorMessage(error));
    }
    this._changed.emit();
  }

  copyId(id: string): void {
    Clipboard.copyToSystem(id);
    Notification.info(`Copied ${id}`, { autoClose: 3000 });
  }

  /** Opens notebooks the server made; each joins the session the server already started. */
  private open(notebooks: IOpenedNotebook[]): void {
    for (const notebook of notebooks) {
      this.docManager.openOrReveal(notebook.path);
    }
  }

  private readonly _changed = new Signal<this, void>(this);
}
