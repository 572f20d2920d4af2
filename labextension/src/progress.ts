import { Notification, showErrorMessage } from '@jupyterlab/apputils';
import { UUID } from '@lumino/coreutils';

import { getOperation } from './api';

const POLL_MS = 500;

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
  const id = Notification.emit(`${title}…`, 'in-progress', { autoClose: false });
  let running = true;
  const poll = async (): Promise<void> => {
    try {
      const op = await getOperation(operation);
      if (running && op.state === 'running') {
        const steps = op.total ? ` (${op.done}/${op.total})` : '';
        Notification.update({
          id,
          message: `${title}: ${op.step}${steps}`,
          type: 'in-progress',
          autoClose: false,
          progress: op.total ? op.done / op.total : undefined
        });
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
    Notification.update({ id, message: describe(result), type: 'success', autoClose: 10000 });
    return result;
  } catch (error) {
    running = false;
    Notification.dismiss(id);
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
