import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { historyIcon } from '@jupyterlab/ui-components';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';

import { SandforkActions } from './actions';
import { sandforkIcon, snapshotIcon } from './icons';
import { SandforkKernels } from './kernel';

/** Command ids; their keyboard shortcuts are in schema/plugin.json. */
export const CommandIDs = {
  snapshot: 'sandfork:snapshot',
  restore: 'sandfork:restore',
  fork: 'sandfork:fork'
};

/**
 * Snapshot, Restore… and Fork, in the palette under "Sandfork", on shortcuts and on the
 * notebook toolbar (toolbar.ts). Their arguments: `notebook`, the id of the notebook panel
 * to act on (a toolbar button's own notebook; else the current notebook), and `toolbar`,
 * set on toolbar buttons, which get short labels and show only while their notebook's
 * kernel is a Sandfork kernel.
 */
export function addCommands(
  app: JupyterFrontEnd,
  tracker: INotebookTracker,
  actions: SandforkActions,
  kernels: SandforkKernels,
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
  for (const command of Object.values(CommandIDs)) {
    palette?.addItem({ command, category: 'Sandfork' });
  }

  // Toolbar buttons and the palette follow the notebooks' kernels.
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
}
