import { IToolbarWidgetRegistry } from '@jupyterlab/apputils';
import { NotebookPanel } from '@jupyterlab/notebook';
import { CommandToolbarButton } from '@jupyterlab/ui-components';
import { CommandRegistry } from '@lumino/commands';
import { Widget } from '@lumino/widgets';

import { CommandIDs } from './commands';
import { SandforkKernels } from './kernel';
import { KernelSandboxes } from './sandboxes';

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
  'sandfork-fork': CommandIDs.fork,
  'sandfork-checkpoints': CommandIDs.checkpoints
};

/**
 * "hibernated", on the toolbar of a notebook while its Sandfork kernel's sandbox is
 * hibernated (its VM stopped until the next cell wakes it).
 */
class HibernatedIndicator extends Widget {
  constructor(
    private readonly panel: NotebookPanel,
    private readonly kernels: SandforkKernels,
    private readonly sandboxes: KernelSandboxes
  ) {
    super();
    this.addClass('sandfork-HibernatedIndicator');
    this.node.textContent = 'hibernated';
    this.node.title =
      "The sandbox's VM is stopped, its memory and disk kept: the next cell wakes it";
    this.hide();
    panel.sessionContext.kernelChanged.connect(this.load, this);
    sandboxes.changed.connect(this.load, this);
    void this.load();
  }

  private async load(): Promise<void> {
    const kernelId = this.kernels.kernelId(this.panel);
    const generation = ++this._generation;
    let hibernated = false;
    try {
      hibernated =
        kernelId !== null && (await this.sandboxes.get(kernelId)).sandbox.status === 'hibernated';
    } catch {
      // Not attached, or gone: not hibernated.
    }
    if (generation === this._generation && !this.isDisposed) {
      this.setHidden(!hibernated);
    }
  }

  private _generation = 0;
}

/**
 * Registers the widgets of the toolbar items: buttons of the commands that act on the
 * button's own notebook and show only while its kernel is a Sandfork kernel, and the
 * hibernated indicator.
 */
export function addToolbarItems(
  registry: IToolbarWidgetRegistry,
  commands: CommandRegistry,
  kernels: SandforkKernels,
  sandboxes: KernelSandboxes
): void {
  for (const [name, id] of Object.entries(TOOLBAR_ITEMS)) {
    registry.addFactory<NotebookPanel>(
      FACTORY,
      name,
      panel =>
        new CommandToolbarButton({ commands, id, args: { toolbar: true, notebook: panel.id } })
    );
  }
  registry.addFactory<NotebookPanel>(
    FACTORY,
    'sandfork-hibernated',
    panel => new HibernatedIndicator(panel, kernels, sandboxes)
  );
}
