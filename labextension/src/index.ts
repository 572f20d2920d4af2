import { ILayoutRestorer, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette, IToolbarWidgetRegistry } from '@jupyterlab/apputils';
import { IDocumentManager } from '@jupyterlab/docmanager';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

import { SandforkActions } from './actions';
import { IServerConfig, getServerConfig } from './api';
import { NotebookCheckpoints } from './checkpoints';
import { addCommands } from './commands';
import { SandforkConfig } from './config';
import { LineageEvents } from './events';
import { SnapshotsPanel } from './panel';
import { KernelRewind, unmarkCellsWhenRun } from './rewind';
import { KernelSandboxes } from './sandboxes';
import { SandboxStatus } from './status';
import { addToolbarItems } from './toolbar';

const PLUGIN_ID = '@sandfork/jupyterlab:plugin';

/** The server's configuration; without the server extension, no kernel is a Sandfork kernel. */
async function loadServerConfig(): Promise<IServerConfig> {
  try {
    return await getServerConfig();
  } catch (error) {
    console.error('Sandfork: cannot read the server configuration (sandfork/api/config)', error);
    return { max_branches: 0, kernel_names: [] };
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description: 'Snapshot, restore and fork the sandboxes of Sandfork kernels.',
  autoStart: true,
  requires: [INotebookTracker, IDocumentManager, ISettingRegistry, IToolbarWidgetRegistry],
  optional: [ICommandPalette, ILayoutRestorer, IStatusBar],
  activate: async (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    docManager: IDocumentManager,
    settingRegistry: ISettingRegistry,
    toolbarRegistry: IToolbarWidgetRegistry,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null,
    statusBar: IStatusBar | null
  ) => {
    const [server, settings] = await Promise.all([
      loadServerConfig(),
      settingRegistry.load(PLUGIN_ID)
    ]);
    const config = new SandforkConfig(server, settings);
    const { kernels } = config;
    const actions = new SandforkActions(docManager, tracker, config);
    // Changes are pushed by the server; this front end's own are told at once too.
    const events = new LineageEvents(app.serviceManager.events.stream);
    actions.changed.connect(() => events.notify());
    const sandboxes = new KernelSandboxes(events);
    const checkpoints = new NotebookCheckpoints(tracker, config);
    const rewind = new KernelRewind(tracker, kernels, sandboxes);
    unmarkCellsWhenRun();
    addCommands(app, tracker, { actions, checkpoints, rewind, kernels }, palette);
    addToolbarItems(toolbarRegistry, app.commands, kernels, sandboxes);

    const panel = new SnapshotsPanel({ actions, rewind, tracker, kernels, sandboxes, events });
    app.shell.add(panel, 'left', { rank: 600 });
    restorer?.add(panel, panel.id);

    if (statusBar) {
      const status = new SandboxStatus(tracker, kernels, sandboxes);
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
