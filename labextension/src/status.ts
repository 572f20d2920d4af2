import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { ApiError, IKernelSandbox, getKernelSandbox } from './api';
import { formatMemory } from './format';
import { sandforkIcon } from './icons';
import { SandforkKernels } from './kernel';
import { errorMessage } from './progress';

const RETRY_MS = 1000;
const MAX_TRIES = 180;

/**
 * The status-bar item of the current Sandfork notebook: its sandbox's accelerator and
 * memory. The server answers 409 while the kernel is still attaching: it retries.
 */
export class SandboxStatus extends Widget {
  constructor(
    private readonly tracker: INotebookTracker,
    private readonly kernels: SandforkKernels
  ) {
    super();
    this.addClass('sandfork-StatusItem');
    sandforkIcon.element({
      container: this._icon,
      tag: 'span',
      className: 'sandfork-StatusItem-icon'
    });
    this.node.append(this._icon, this._text);
    tracker.currentChanged.connect(this.follow, this);
    this.follow();
  }

  /** Whether a Sandfork notebook is current: the status bar shows the item only then. */
  get active(): boolean {
    return this._active;
  }

  get activeChanged(): ISignal<this, void> {
    return this._activeChanged;
  }

  dispose(): void {
    this._panel?.sessionContext.kernelChanged.disconnect(this.load, this);
    super.dispose();
  }

  private follow(): void {
    this._panel?.sessionContext.kernelChanged.disconnect(this.load, this);
    this._panel = this.tracker.currentWidget;
    this._panel?.sessionContext.kernelChanged.connect(this.load, this);
    void this.load();
  }

  private async load(): Promise<void> {
    const kernelId = this.kernels.kernelId(this._panel);
    const generation = ++this._generation;
    this.display(kernelId === null ? null : 'Sandbox: attaching…', '');
    for (let tries = 0; kernelId !== null && tries < MAX_TRIES; tries++) {
      let info: IKernelSandbox;
      try {
        info = await getKernelSandbox(kernelId);
      } catch (error) {
        if (error instanceof ApiError && error.status === 409) {
          await new Promise(resolve => setTimeout(resolve, RETRY_MS));
          if (generation !== this._generation) {
            return;
          }
          continue;
        }
        if (generation === this._generation) {
          this.display('Sandbox: unavailable', errorMessage(error));
        }
        return;
      }
      if (generation === this._generation) {
        const { sandbox } = info;
        this.display(
          `${sandbox.accelerator.toUpperCase()} · ${formatMemory(sandbox.memory_mb)}`,
          `Sandfork sandbox ${sandbox.id}: template ${sandbox.template}, ` +
            `${sandbox.cpu} CPU, ${formatMemory(sandbox.memory_mb)}, ${sandbox.accelerator}`
        );
      }
      return;
    }
    if (kernelId !== null && generation === this._generation) {
      this.display('Sandbox: not attached', 'The kernel did not attach to a sandbox');
    }
  }

  /** Shows a text (null: the item is inactive) and its tooltip. */
  private display(text: string | null, title: string): void {
    this._text.textContent = text ?? '';
    this.node.title = title;
    if (this._active !== (text !== null)) {
      this._active = text !== null;
      this._activeChanged.emit();
    }
  }

  private _panel: NotebookPanel | null = null;
  private _generation = 0;
  private _active = false;
  private readonly _activeChanged = new Signal<this, void>(this);
  private readonly _icon = document.createElement('span');
  private readonly _text = document.createElement('span');
}
