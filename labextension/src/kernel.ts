import type * as nbformat from '@jupyterlab/nbformat';
import { NotebookPanel } from '@jupyterlab/notebook';

import { INotebookState } from './api';

/**
 * Which kernels are Sandfork kernels: the kernelspec names the server extension reports
 * (`kernel_names` of `GET sandfork/api/config`, its `is_sandfork_spec`), so both sides go by
 * one definition.
 */
export class SandforkKernels {
  constructor(names: Iterable<string>) {
    this._names = new Set(names);
  }

  /** Whether the kernelspec `name` is a Sandfork kernel. */
  has(name: string): boolean {
    return this._names.has(name);
  }

  /** The id of the notebook's kernel if it is a Sandfork kernel, else null. */
  kernelId(panel: NotebookPanel | null | undefined): string | null {
    const kernel = panel?.sessionContext.session?.kernel;
    return kernel && this.has(kernel.name) ? kernel.id : null;
  }

  /** The notebook as the front end holds it now (unsaved edits included), with its kernel. */
  notebookState(panel: NotebookPanel | null | undefined): INotebookState | null {
    const kernelId = this.kernelId(panel);
    if (!panel || kernelId === null || panel.model === null) {
      return null;
    }
    // A notebook model serializes to an nbformat document (its interface types it loosely).
    const notebook = panel.model.toJSON() as nbformat.INotebookContent;
    return { kernel_id: kernelId, path: panel.context.path, notebook };
  }

  private readonly _names: ReadonlySet<string>;
}
