import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { Cell } from '@jupyterlab/cells';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { historyIcon } from '@jupyterlab/ui-components';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';

import { SandforkActions } from './actions';
import { NotebookCheckpoints } from './checkpoints';
import { sandforkIcon, snapshotIcon } from './icons';
import { SandforkKernels } from './kernel';
import { KernelRewind } from './rewind';

/** Command ids; their keyboard shortcuts are in schema/plugin.json. */
export const CommandIDs = {
  snapshot: 'sandfork:snapshot',
  restore: 'sandfork:restore',
  fork: 'sandfork:fork',
  checkpoints: 'sandfork:toggle-checkpoints',
  rewind: 'sandfork:rewind',
  rewindToCell: 'sandfork:rewind-to-cell'
};

/** Those in the palette (rewinding to a cell is on the cell's context menu). */
const PALETTE = [
  CommandIDs.snapshot,
  CommandIDs.restore,
  CommandIDs.fork,
  CommandIDs.checkpoints,
  CommandIDs.rewind
];

/** What the commands do. */
export interface ICommandTargets {
  actions: SandforkActions;
  checkpoints: NotebookCheckpoints;
  rewind: KernelRewind;
  kernels: SandforkKernels;
}

/**
 * Snapshot, Restore…, Fork, the checkpoints toggle and Rewind, in the palette under
 * "Sandfork", on shortcuts and on the notebook toolbar (toolbar.ts); "Rewind kernel to before
 * this cell" on the cell context menu. Their arguments: `notebook`, the id of the notebook
 * panel to act on (a toolbar button's own notebook; else the current notebook), and
 * `toolbar`, set on toolbar buttons, which get short labels and show only while their
 * notebook's kernel is a Sandfork kernel.
 */
export function addCommands(
  app: JupyterFrontEnd,
  tracker: INotebookTracker,
  { actions, checkpoints, rewind, kernels }: ICommandTargets,
  palette: ICommandPalette | null
): void {
  const panelOf = (args: ReadonlyPartialJSONObject): NotebookPanel | null => {
    const id = args.notebook;
    return typeof id === 'string'
      ? (tracker.find(panel => panel.id === id) ?? null)
      : tracker.currentWidget;
  };
  const isSandfork = (args: ReadonlyPartialJSONObject): boolean =>
    kernels.kernelId(panelOf(args)) !== null;
  const isVisible = (args: ReadonlyPartialJSONObject): boolean =>
    args.notebook === undefined || isSandfork(args);
  const label =
    (short: string, long: string) =>
    (args: ReadonlyPartialJSONObject): string =>
      args.toolbar ? short : long;
  /** The cell the context menu was opened on, and its notebook (else the active cell). */
  const contextCell = (): [NotebookPanel | null, Cell | null] => {
    const node = app.contextMenuHitTest(n => n.classList.contains('jp-Cell'));
    const panel = node ? tracker.find(p => p.node.contains(node)) : tracker.currentWidget;
    const cell = node
      ? panel?.content.widgets.find(c => c.node === node)
      : panel?.content.activeCell;
    return [panel ?? null, cell ?? null];
  };

  app.commands.addCommand(CommandIDs.snapshot, {
    label: label('Snapshot', 'Snapshot Sandbox'),
    caption: "Snapshot the notebook's sandbox (kernel memory and disk) with the notebook",
    icon: snapshotIcon,
    isEnabled: isSandfork,
    isVisible,
    execute: async args => {
      const state = kernels.notebookState(panelOf(args));
      if (state) {
        await actions.snapshot(state);
      }
    }
  });
  app.commands.addCommand(CommandIDs.restore, {
    label: label('Restore…', 'Restore Snapshot…'),
    caption: 'Restore a snapshot into a new notebook',
    icon: historyIcon,
    isVisible,
    execute: args => actions.chooseAndRestore(panelOf(args)?.context.path ?? null)
  });
  app.commands.addCommand(CommandIDs.fork, {
    label: label('Fork', 'Fork Sandbox…'),
    caption: "Fork the notebook's live sandbox into branch notebooks",
    icon: sandforkIcon,
    isEnabled: isSandfork,
    isVisible,
    execute: async args => {
      const state = kernels.notebookState(panelOf(args));
      if (state) {
        await actions.fork(state);
      }
    }
  });
  const checkpointing = (args: ReadonlyPartialJSONObject): boolean => {
    const panel = panelOf(args);
    return panel !== null && checkpoints.isOn(panel);
  };
  app.commands.addCommand(CommandIDs.checkpoints, {
    label: args =>
      args.toolbar
        ? `Checkpoints: ${checkpointing(args) ? 'on' : 'off'}`
        : 'Checkpoint After Every Cell',
    caption: 'Take a checkpoint of the sandbox after every cell, to rewind the kernel to',
    className: 'sandfork-CheckpointsToggle',
    isToggled: checkpointing,
    isEnabled: isSandfork,
    isVisible,
    execute: args => {
      const panel = panelOf(args);
      if (panel) {
        checkpoints.toggle(panel);
      }
    }
  });
  app.commands.addCommand(CommandIDs.rewind, {
    label: 'Rewind Kernel One Cell',
    caption: "Restore the kernel's checkpoint from before its last cell",
    isEnabled: isSandfork,
    isVisible,
    execute: async args => {
      const panel = panelOf(args);
      if (panel) {
        await rewind.oneCell(panel);
      }
    }
  });
  app.commands.addCommand(CommandIDs.rewindToCell, {
    label: 'Rewind kernel to before this cell',
    caption: "Restore the kernel's checkpoint from before this cell ran",
    isVisible: () => kernels.kernelId(contextCell()[0]) !== null,
    isEnabled: () => rewind.canRewindTo(...contextCell()),
    execute: async () => {
      const [panel, cell] = contextCell();
      if (panel && cell) {
        await rewind.toCell(panel, cell);
      }
    }
  });
  for (const command of PALETTE) {
    palette?.addItem({ command, category: 'Sandfork' });
  }

  // Toolbar buttons and the palette follow the notebooks' kernels and checkpoint choices.
  const changed = (): void => {
    for (const command of Object.values(CommandIDs)) {
      app.commands.notifyCommandChanged(command);
    }
  };
  tracker.widgetAdded.connect((_, panel) => {
    panel.sessionContext.kernelChanged.connect(changed);
    changed();
  });
  tracker.currentChanged.connect(changed);
  checkpoints.changed.connect(changed);
}
