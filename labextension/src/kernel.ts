import type * as nbformat from '@jupyterlab/nbformat';
import { NotebookPanel } from '@jupyterlab/notebook';

import { INotebookState } from './api';

/** The kernelspec name of the Sandfork kernel. */
export const SANDFORK_KERNEL = 'sandfork';

/** The id of the notebook's kernel if it is a Sandfork kernel, else null. */
export function sandforkKernelId(panel: NotebookPanel | null): string | null {
  const kernel = panel?.sessionContext.session?.kernel;
  return kernel && kernel.name === SANDFORK_KERNEL ? kernel.id : null;
}

/** The notebook as the front end holds it now (unsaved edits included), with its kernel. */
export function notebookState(panel: NotebookPanel): INotebookState | null {
  const kernelId = sandforkKernelId(panel);
  if (kernelId === null || panel.model === null) {
    return null;
  }
  // A notebook model serializes to an nbformat document (its interface types it loosely).
  const notebook = panel.model.toJSON() as nbformat.INotebookContent;
  return { kernel_id: kernelId, path: panel.context.path, notebook };
}
