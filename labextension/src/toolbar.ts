import { IToolbarWidgetRegistry } from '@jupyterlab/apputils';
import { NotebookPanel } from '@jupyterlab/notebook';
import { CommandToolbarButton } from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';

import { CommandIDs } from './commands';

/** The notebook's document widget factory, whose toolbar takes the items. */
const FACTORY = 'Notebook';

/**
 * The notebook toolbar items schema/plugin.json declares (`jupyter.lab.toolbars`), by name,
 * with their commands. Like the notebook's own items, where they go and whether they show
 * are settings (Settings › Notebook Panel › toolbar: `rank`, `disabled`).
 */
const TOOLBAR_ITEMS: Readonly<Record<string, string>> = {
  'sandfork-snapshot': CommandIDs.snapshot,
  'sandfork-restore': CommandIDs.restore,
  'sandfork-fork': CommandIDs.fork
};

/**
 * Registers the widgets of the toolbar items: buttons of the commands that act on the
 * button's own notebook and show only while its kernel is a Sandfork kernel.
 */
export function addToolbarItems(registry: IToolbarWidgetRegistry, commands: CommandRegistry): void {
  for (const [name, id] of Object.entries(TOOLBAR_ITEMS)) {
    registry.addFactory<NotebookPanel>(
      FACTORY,
      name,
      panel =>
        new CommandToolbarButton({ commands, id, args: { toolbar: true, notebook: panel.id } })
    );
  }
}
