import { Notification, showErrorMessage } from '@jupyterlab/apputils';
import { UUID } from '@lumino/coreutils';

import { getOperation } from './api';

const POLL_MS = 500;

/**
 * A toast updated or dismissed right after it was emitted keeps showing what it first said
 * (jupyterlab/jupyterlab#15558): its outcome waits until it has been up this long.
 */
const SETTLE_MS = 500;

/** An "in progress" notification, then its outcome. */
export class ProgressToast {
  constructor(message: string) {
    this.id = Notification.emit(message, 'in-progress', { autoClose: false });
  }

  /** Says how it is going, while it runs. */
  progress(message: string, progress?: number): void {
    Notification.update({ id: this.id, message, type: 'in-progress', autoClose: false, progress });
  }

  /** Ends it with a success message. */
  async succeed(message: string): Promise<void> {
    await this._settled;
    Notification.update({ id: this.id, message, type: 'success', autoClose: 10000 });
  }

  /** Ends it quietly (the caller shows the failure). */
  async dismiss(): Promise<void> {
    await this._settled;
    Notification.dismiss(this.id);
  }

  readonly id: string;
  private readonly _settled = new Promise(resolve => window.setTimeout(resolve, SETTLE_MS));
}

/**
 * Runs a long call under a fresh `operation` id, showing its progress in a notification
 * (polled from `operations/{id}`), then the outcome. Failures go to an error dialog with the
 * server's message; the promise then resolves to null.
 */
export async function withProgress<T>(
  title: string,
  call: (operation: string) => Promise<T>,
  describe: (result: T) => string
): Promise<T | null> {
  const operation = UUID.uuid4();
  const toast = new ProgressToast(`${title}…`);
  let running = true;
  const poll = async (): Promise<void> => {
    try {
      const op = await getOperation(operation);
      if (running && op.state === 'running') {
        const steps = op.total ? ` (${op.done}/${op.total})` : '';
        toast.progress(`${title}: ${op.step}${steps}`, op.total ? op.done / op.total : undefined);
      }
    } catch {
      // The operation is not registered yet, or is over: the call's own answer tells.
    }
    if (running) {
      timer = window.setTimeout(poll, POLL_MS);
    }
  };
  let timer = window.setTimeout(poll, POLL_MS);
  try {
    const result = await call(operation);
    running = false;
    void toast.succeed(describe(result));
    return result;
  } catch (error) {
    running = false;
    void toast.dismiss();
    await showErrorMessage(`${title} failed`, errorMessage(error));
    return null;
  } finally {
    window.clearTimeout(timer);
  }
}

/** The message of an error thrown by the API or the browser, as shown to the user. */
export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
