import { DocumentRegistry } from '@jupyterlab/docregistry';
import { INotebookModel, NotebookPanel } from '@jupyterlab/notebook';
import { LabIcon, ToolbarButton, historyIcon } from '@jupyterlab/ui-components';
import { DisposableDelegate, IDisposable } from '@lumino/disposable';

import { SandforkActions } from './actions';
import { INotebookState } from './api';
import { sandforkIcon, snapshotIcon } from './icons';
import { notebookState, sandforkKernelId } from './kernel';

interface IButtonSpec {
  name: string;
  label: string;
  tooltip: string;
  icon: LabIcon;
  run: (panel: NotebookPanel) => Promise<void>;
}

/** Where the buttons go: after the notebook's run/interrupt/restart group. */
const TOOLBAR_INDEX = 10;

/**
 * Adds Snapshot, Restore… and Fork to every notebook's toolbar, shown only while the
 * notebook's kernel is a Sandfork kernel.
 */
export class SandforkToolbar implements DocumentRegistry.IWidgetExtension<
  NotebookPanel,
  INotebookModel
> {
  constructor(private readonly actions: SandforkActions) {}

  createNew(panel: NotebookPanel): IDisposable {
    const actions = this.actions;
    const withState =
      (run: (state: INotebookState) => Promise<void>) =>
      async (target: NotebookPanel): Promise<void> => {
        const state = notebookState(target);
        if (state) {
          await run(state);
        }
      };
    const specs: IButtonSpec[] = [
      {
        name: 'snapshot',
        label: 'Snapshot',
        tooltip: 'Snapshot the sandbox (kernel memory and disk) with this notebook',
        icon: snapshotIcon,
        run: withState(state => actions.snapshot(state))
      },
      {
        name: 'restore',
        label: 'Restore…',
        tooltip: 'Restore a snapshot into a new notebook',
        icon: historyIcon,
        run: target => actions.chooseAndRestore(target.context.path)
      },
      {
        name: 'fork',
        label: 'Fork',
        tooltip: 'Fork the live sandbox into branch notebooks',
        icon: sandforkIcon,
        run: withState(state => actions.fork(state))
      }
    ];
    const buttons = specs.map((spec, offset) => {
      const button = new ToolbarButton({
        className: `sandfork-ToolbarButton sandfork-ToolbarButton-${spec.name}`,
        label: spec.label,
        tooltip: spec.tooltip,
        icon: spec.icon,
        onClick: () => void spec.run(panel)
      });
      panel.toolbar.insertItem(TOOLBAR_INDEX + offset, `sandfork-${spec.name}`, button);
      return button;
    });
    const sync = (): void => {
      const visible = sandforkKernelId(panel) !== null;
      buttons.forEach(button => button.setHidden(!visible));
    };
    panel.sessionContext.kernelChanged.connect(sync);
    sync();
    return new DisposableDelegate(() => {
      panel.sessionContext.kernelChanged.disconnect(sync);
      buttons.forEach(button => button.dispose());
    });
  }
}
