import { Notification } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Kernel } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

import { SandforkConfig } from './config';
import { runMagic } from './magic';
import { errorMessage } from './progress';

/** The notebook metadata key of Sandfork's per-notebook choices. */
const METADATA_KEY = 'sandfork';

/** Kernel states after which a kernel has forgotten what it was told (a new process). */
const FORGETFUL: ReadonlySet<Kernel.Status> = new Set([
  'starting',
  'restarting',
  'autorestarting',
  'dead',
  'unknown'
]);

/**
 * "Checkpoint after every cell", per notebook: the notebook's own choice in its metadata
 * (`metadata.sandfork.checkpoints`, set by the toolbar toggle), else the user's setting
 * `checkpointCells`. Its Sandfork kernel is told with a silent `%checkpoints on KEEP` or
 * `%checkpoints off` whenever it is new or restarted (once idle), the choice changes, or the
 * settings do.
 */
export class NotebookCheckpoints {
  constructor(
    tracker: INotebookTracker,
    private readonly config: SandforkConfig
  ) {
    tracker.forEach(panel => this.track(panel));
    tracker.widgetAdded.connect((_, panel) => this.track(panel));
    config.changed.connect(() => {
      tracker.forEach(panel => {
        this.tell(panel);
        this._changed.emit(panel);
      });
    });
  }

  /** Emitted with a notebook whose choice changed. */
  get changed(): ISignal<this, NotebookPanel> {
    return this._changed;
  }

  /** Whether the notebook checkpoints after every cell. */
  isOn(panel: NotebookPanel): boolean {
    const own = this.metadata(panel).checkpoints;
    return typeof own === 'boolean' ? own : this.config.checkpointCells;
  }

  /** Turns checkpoints of the notebook on or off: its own choice from now on. */
  toggle(panel: NotebookPanel): void {
    panel.model?.setMetadata(METADATA_KEY, {
      ...this.metadata(panel),
      checkpoints: !this.isOn(panel)
    });
  }

  private metadata(panel: NotebookPanel): Record<string, unknown> {
    const value = panel.model?.getMetadata(METADATA_KEY);
    return value !== null && typeof value === 'object' ? value : {};
  }

  private track(panel: NotebookPanel): void {
    const session = panel.sessionContext;
    session.kernelChanged.connect(() => {
      this._told.delete(panel);
      this.tell(panel);
    });
    session.statusChanged.connect((_, status) => {
      if (FORGETFUL.has(status)) {
        this._told.delete(panel);
      } else {
        this.tell(panel);
      }
    });
    void panel.context.ready.then(() => {
      panel.model?.metadataChanged.connect((_, change) => {
        if (change.key === METADATA_KEY) {
          this.tell(panel);
          this._changed.emit(panel);
        }
      });
      this.tell(panel);
    });
    panel.disposed.connect(() => this._told.delete(panel));
  }

  /** Tells the notebook's kernel, when up, the command it was not told yet. */
  private tell(panel: NotebookPanel): void {
    const kernel = panel.sessionContext.session?.kernel;
    if (
      !kernel ||
      !this.config.kernels.has(kernel.name) ||
      (kernel.status !== 'idle' && kernel.status !== 'busy') ||
      panel.model === null
    ) {
      return;
    }
    const command = this.isOn(panel)
      ? `%checkpoints on ${this.config.checkpointsKept}`
      : '%checkpoints off';
    if (this._told.get(panel) === command) {
      return;
    }
    this._told.set(panel, command);
    runMagic(kernel, command).catch(error => {
      Notification.error(`${panel.context.path}: ${command} failed: ${errorMessage(error)}`, {
        autoClose: 10000
      });
    });
  }

  /** What each notebook's kernel was told last. */
  private readonly _told = new Map<NotebookPanel, string>();
  private readonly _changed = new Signal<this, NotebookPanel>(this);
}
