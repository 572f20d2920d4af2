import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ISignal, Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

import { IKernelSandbox } from './api';
import { formatMemory } from './format';
import { sandforkIcon } from './icons';
import { SandforkKernels } from './kernel';
import { errorMessage } from './progress';
import { KernelSandboxes, isAttaching } from './sandboxes';

/** How a sandbox runs, as the status bar says it: "Container" or "VM · TCG". */
function isolation(sandbox: IKernelSandbox['sandbox']): string {
  return sandbox.isolation === 'container'
    ? 'Container'
    : `VM · ${sandbox.accelerator.toUpperCase()}`;
}

/** The status item's text and tooltip for a kernel's sandbox. */
function describe({ sandbox }: IKernelSandbox): [string, string] {
  const name = `Sandfork sandbox ${sandbox.id}`;
  switch (sandbox.status) {
    case 'hibernated':
      return [
        'Hibernated',
        `${name} is hibernated: it is stopped, its memory and disk kept. ` +
          'The next cell wakes it.'
      ];
    case 'waking':
      return ['Waking…', `${name} is waking: it starts again where it stopped.`];
    default:
      return [
        `${isolation(sandbox)} · ${formatMemory(sandbox.memory_mb)}`,
        `${name}: template ${sandbox.template}, ${sandbox.cpu} CPU, ` +
          `${formatMemory(sandbox.memory_mb)}, ${isolation(sandbox)}, ${sandbox.status}`
      ];
  }
}

/**
 * The status-bar item of the current Sandfork notebook: its sandbox's isolation and
 * memory, or that it is hibernated or waking. It follows the current notebook, its kernel
 * and the server's events.
 */
export class SandboxStatus extends Widget {
  constructor(
    private readonly tracker: INotebookTracker,
    private readonly kernels: SandforkKernels,
    private readonly sandboxes: KernelSandboxes
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
    sandboxes.changed.connect(this.load, this);
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
    if (kernelId === null) {
      this.display(null, '');
      return;
    }
    if (kernelId !== this._kernelId) {
      this._kernelId = kernelId;
      this.display('Sandbox: attaching…', '');
    }
    let shown: [string, string];
    try {
      shown = describe(await this.sandboxes.get(kernelId));
    } catch (error) {
      shown = isAttaching(error)
        ? ['Sandbox: not attached', 'The kernel did not attach to a sandbox']
        : ['Sandbox: unavailable', errorMessage(error)];
    }
    if (generation === this._generation) {
      this.display(...shown);
    }
  }

  /** Shows a text (null: the item is inactive) and its tooltip. */
  private display(text: string | null, title: string): void {
    this._text.textContent = text ?? '';
    this.node.title = title;
    this.toggleClass('sandfork-mod-hibernated', text === 'Hibernated');
    if (this._active !== (text !== null)) {
      this._active = text !== null;
      this._activeChanged.emit();
    }
  }

  private _panel: NotebookPanel | null = null;
  private _kernelId: string | null = null;
  private _generation = 0;
  private _active = false;
  private readonly _activeChanged = new Signal<this, void>(this);
  private readonly _icon = document.createElement('span');
  private readonly _text = document.createElement('span');
}
