import { JupyterFrontEnd } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { historyIcon } from '@jupyterlab/ui-components';

import { SandforkActions } from './actions';
import { sandforkIcon, snapshotIcon } from './icons';
import { notebookState, sandforkKernelId } from './kernel';

/** Command ids; their keyboard shortcuts are in schema/plugin.json. */
export const CommandIDs = {
  snapshot: 'sandfork:snapshot',
  restore: 'sandfork:restore',
  fork: 'sandfork:fork'
};

/** Snapshot, Restore… and Fork of the current notebook, in the palette under "Sandfork". */
export function addCommands(
  app: JupyterFrontEnd,
  tracker: INotebookTracker,
  actions: SandforkActions,
  palette: ICommandPalette | null
): void {
  const isSandfork = (): boolean => sandforkKernelId(tracker.currentWidget) !== null;
  const current = () => (tracker.currentWidget ? notebookState(tracker.currentWidget) : null);

  app.commands.addCommand(CommandIDs.snapshot, {
    label: 'Snapshot Sandbox',
    caption: "Snapshot the current notebook's sandbox (kernel memory and disk) with the notebook",
    icon: snapshotIcon,
    isEnabled: isSandfork,
    execute: async () => {
      const state = current();
      if (state) {
        await actions.snapshot(state);
      }
    }
  });
  app.commands.addCommand(CommandIDs.restore, {
    label: 'Restore Snapshot…',
    caption: 'Restore a snapshot into a new notebook',
    icon: historyIcon,
    execute: () => actions.chooseAndRestore(tracker.currentWidget?.context.path ?? null)
  });
  app.commands.addCommand(CommandIDs.fork, {
    label: 'Fork Sandbox…',
    caption: "Fork the current notebook's live sandbox into branch notebooks",
    icon: sandforkIcon,
    isEnabled: isSandfork,
    execute: async () => {
      const state = current();
      if (state) {
        await actions.fork(state);
      }
    }
  });
  for (const command of Object.values(CommandIDs)) {
    palette?.addItem({ command, category: 'Sandfork' });
  }
}
