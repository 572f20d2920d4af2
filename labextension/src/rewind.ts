import { showErrorMessage } from '@jupyterlab/apputils';
import { Cell, ICodeCellModel } from '@jupyterlab/cells';
import { INotebookTracker, NotebookActions, NotebookPanel } from '@jupyterlab/notebook';

import { ISnapshot } from './api';
import { SandforkKernels } from './kernel';
import { runMagic } from './magic';
import { ProgressToast, errorMessage } from './progress';
import { KernelSandboxes } from './sandboxes';

/** The class of a cell that has not run in the kernel's state (after a rewind). */
const NOT_RUN_CLASS = 'sandfork-mod-notRun';
const NOT_RUN_TITLE = 'Not run in this kernel state (rewound)';

/** The execution count of a code cell (null when it has not run), else null. */
export function executionCount(cell: Cell): number | null {
  return cell.model.type === 'code' ? (cell.model as ICodeCellModel).executionCount : null;
}

/**
 * Shows the code cells that ran with an execution count `which` picks as not run in the
 * kernel's state: no execution count, a dimmed prompt, until they run again.
 */
function markNotRun(panel: NotebookPanel, which: (count: number) => boolean): void {
  for (const cell of panel.content.widgets) {
    const count = executionCount(cell);
    if (count !== null && which(count)) {
      (cell.model as ICodeCellModel).executionCount = null;
      cell.addClass(NOT_RUN_CLASS);
      cell.promptNode?.setAttribute('title', NOT_RUN_TITLE);
    }
  }
}

/** A cell that runs again shows as run (connect once). */
export function unmarkCellsWhenRun(): void {
  NotebookActions.executionScheduled.connect((_, { cell }) => {
    if (cell.hasClass(NOT_RUN_CLASS)) {
      cell.removeClass(NOT_RUN_CLASS);
      cell.promptNode?.removeAttribute('title');
    }
  });
}

/**
 * Time travel of a notebook's Sandfork kernel, by its magics (a silent execute request, with
 * a notification while it runs): the kernel goes on in a sandbox restored from one of its
 * checkpoints, and the cells the restored state has not run show as not run.
 */
export class KernelRewind {
  constructor(
    private readonly tracker: INotebookTracker,
    private readonly kernels: SandforkKernels,
    private readonly sandboxes: KernelSandboxes
  ) {}

  /** Whether the kernel can be rewound to before `cell`: a code cell that ran in it. */
  canRewindTo(panel: NotebookPanel | null, cell: Cell | null): boolean {
    return this.kernels.kernelId(panel) !== null && cell !== null && executionCount(cell) !== null;
  }

  /** `%rewind --cell ID`: the kernel as before `cell` ran; it and the later cells not run. */
  async toCell(panel: NotebookPanel, cell: Cell): Promise<void> {
    const count = executionCount(cell);
    if (count !== null && (await this.run(panel, `%rewind --cell ${cell.model.id}`))) {
      markNotRun(panel, ran => ran >= count);
    }
  }

  /** `%rewind 1`: the kernel as before its last cell, which shows as not run. */
  async oneCell(panel: NotebookPanel): Promise<void> {
    const counts = panel.content.widgets.map(executionCount).filter(c => c !== null);
    const last = counts.length ? Math.max(...counts) : null;
    if ((await this.run(panel, '%rewind 1')) && last !== null) {
      markNotRun(panel, ran => ran >= last);
    }
  }

  /**
   * `%restore ID` of a checkpoint, in the notebook whose kernel took it (its lineage): the
   * kernel goes back (or forward) to that cell; every cell shows as not run.
   */
  async toCheckpoint(checkpoint: ISnapshot): Promise<void> {
    const panel = await this.owner(checkpoint);
    if (panel === null) {
      await showErrorMessage(
        'Cannot rewind',
        'The notebook whose kernel took this checkpoint is not open with that kernel. ' +
          'Restore it into a new notebook instead.'
      );
      return;
    }
    if (await this.run(panel, `%restore ${checkpoint.id}`)) {
      markNotRun(panel, () => true);
    }
  }

  /** The open notebook whose kernel has the checkpoint's lineage. */
  private async owner(checkpoint: ISnapshot): Promise<NotebookPanel | null> {
    const panels: NotebookPanel[] = [];
    this.tracker.forEach(panel => panels.push(panel));
    for (const panel of panels) {
      const kernelId = this.kernels.kernelId(panel);
      try {
        if (kernelId && (await this.sandboxes.get(kernelId)).lineage === checkpoint.lineage) {
          return panel;
        }
      } catch {
        // Not attached, or gone: not the owner.
      }
    }
    return null;
  }

  /** Runs a magic of the notebook's kernel with a notification; whether it succeeded. */
  private async run(panel: NotebookPanel, code: string): Promise<boolean> {
    const kernel = panel.sessionContext.session?.kernel;
    if (!kernel || this.kernels.kernelId(panel) === null) {
      return false;
    }
    const toast = new ProgressToast('Rewinding kernel…');
    try {
      const printed = await runMagic(kernel, code);
      void toast.succeed(printed || `Rewound the kernel of ${panel.context.path}`);
      return true;
    } catch (error) {
      void toast.dismiss();
      await showErrorMessage('Rewind failed', errorMessage(error));
      return false;
    }
  }
}
