import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';

import { SandforkActions } from './actions';
import { addCommands } from './commands';
import { SnapshotsPanel } from './panel';
import { SandboxStatus } from './status';
import { SandforkToolbar } from './toolbar';

const plugin: JupyterFrontEndPlugin<void> = {
  id: '@sandfork/jupyterlab:plugin',
  description: 'Snapshot, restore and fork the sandboxes of Sandfork kernels.',
  autoStart: true,
  requires: [INotebookTracker, IDocumentManager],
  optional: [ICommandPalette, ILayoutRestorer, IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    docManager: IDocumentManager,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    statusBar: IStatusBar | null
  ) => {
    const actions = new SandforkActions(docManager, tracker);
    addCommands(app, tracker, actions, palette);
    app.docRegistry.addWidgetExtension('Notebook', new SandforkToolbar(actions));

    const panel = new SnapshotsPanel(actions);
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, panel.id);

    if (statusBar) {
      const status = new SandboxStatus(tracker);
      statusBar.registerStatusItem('@sandfork/jupyterlab:sandbox', {
        item: status,
        align: 'left',
        rank: 4,
        isActive: () => status.active,
        activeStateChanged: status.activeChanged
      });
    }
  }
};

export default plugin;
