import { Event } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';

/** What the server extension emits on any change of snapshots or sandboxes, from anywhere. */
export const LINEAGE_EVENT = 'urn:sandfork:lineage:v1';

/** What Jupyter Server emits when a kernel is started, restarted or shut down. */
export const KERNEL_EVENT = 'https://events.jupyter.org/jupyter_server/kernel_actions/v1';

const SCHEMAS: ReadonlySet<string> = new Set([LINEAGE_EVENT, KERNEL_EVENT]);

/** Events closer together than this are told as one. */
const DEBOUNCE_MS = 200;

/**
 * When snapshots, sandboxes or kernels may have changed: pushed by the server on Jupyter
 * Server's event bus (`serviceManager.events`), so changes made elsewhere (another tab,
 * another process, the kernel itself) show at once, with no polling. A burst of events is
 * told once, at most 200 ms after its first.
 */
export class LineageEvents {
  constructor(stream: Event.Stream) {
    stream.connect((_, emission) => {
      if (SCHEMAS.has(emission.schema_id)) {
        this.notify();
      }
    }, this);
  }

  /** Emitted after a change: whoever shows snapshots, sandboxes or kernels reloads them. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Tells `changed` soon, e.g. after an operation of this front end. */
  notify(): void {
    if (this._timer === null) {
      this._timer = window.setTimeout(() => {
        this._timer = null;
        this._changed.emit();
      }, DEBOUNCE_MS);
    }
  }

  private _timer: number | null = null;
  private readonly _changed = new Signal<this, void>(this);
}
