import { Kernel, KernelMessage } from '@jupyterlab/services';

/** A Sandfork kernel magic that failed, with the kernel's message (meant to be shown as is). */
export class MagicError extends Error {}

/**
 * Runs one of the Sandfork kernel's own magics (`%checkpoints`, `%rewind`, `%restore`) as a
 * silent execute request: no execution count, no history, nothing in the notebook, and a
 * failure does not abort the cells queued after it. Resolves to what it printed; rejects with
 * a MagicError of the reply's `evalue` when the kernel answers "error".
 */
export async function runMagic(kernel: Kernel.IKernelConnection, code: string): Promise<string> {
  const future = kernel.requestExecute({
    code,
    silent: true,
    store_history: false,
    stop_on_error: false
  });
  let printed = '';
  future.onIOPub = message => {
    if (KernelMessage.isStreamMsg(message) && message.content.name === 'stdout') {
      printed += message.content.text;
    }
  };
  const { content } = await future.done;
  if (content.status === 'error') {
    throw new MagicError(content.evalue || content.ename);
  }
  if (content.status !== 'ok') {
    throw new MagicError(`${code}: the kernel did not run it (${content.status})`);
  }
  return printed.trim();
}
