import { ISignal, Signal } from '@lumino/signaling';

import { ApiError, IKernelSandbox, getKernelSandbox } from './api';
import { LineageEvents } from './events';

const RETRY_MS = 1000;
const MAX_TRIES = 180;

/** Whether `error` says the kernel has not attached to a sandbox (in time). */
export function isAttaching(error: unknown): boolean {
  return error instanceof ApiError && error.status === 409;
}

/**
 * The sandbox behind each Sandfork kernel (`GET kernels/{id}`), shared by the status item,
 * the notebooks' hibernated indicators, the side panel and rewinds: asked once per kernel
 * until the server tells of a change (then `changed`, and asked again). The server answers
 * 409 while a kernel is still attaching: it retries, for up to three minutes.
 */
export class KernelSandboxes {
  constructor(events: LineageEvents) {
    events.changed.connect(() => {
      this._answers.clear();
      this._generation++;
      this._changed.emit();
    }, this);
  }

  /** Emitted when the answers may be stale: ask again. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get(kernelId: string): Promise<IKernelSandbox> {
    let answer = this._answers.get(kernelId);
    if (answer === undefined) {
      const loading = this.load(kernelId);
      this._answers.set(kernelId, loading);
      loading.catch(() => {
        if (this._answers.get(kernelId) === loading) {
          this._answers.delete(kernelId);
        }
      });
      answer = loading;
    }
    return answer;
  }

  private async load(kernelId: string): Promise<IKernelSandbox> {
    const generation = this._generation;
    for (let tries = 1; ; tries++) {
      try {
        return await getKernelSandbox(kernelId);
      } catch (error) {
        if (!isAttaching(error) || tries >= MAX_TRIES) {
          throw error;
        }
      }
      await new Promise(resolve => window.setTimeout(resolve, RETRY_MS));
      if (generation !== this._generation) {
        // A change came in the meantime: join the fresh request.
        return this.get(kernelId);
      }
    }
  }

  private _generation = 0;
  private readonly _answers = new Map<string, Promise<IKernelSandbox>>();
  private readonly _changed = new Signal<this, void>(this);
}
