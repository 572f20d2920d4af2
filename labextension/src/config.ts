import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { ISignal, Signal } from '@lumino/signaling';

import { IServerConfig } from './api';
import { SandforkKernels } from './kernel';

/**
 * What the front end goes by: the server's hard limits and its definition of a Sandfork
 * kernel (`GET sandfork/api/config`), and the user's settings (schema/plugin.json, edited in
 * Settings › Sandfork), read when used so that changes apply at once.
 */
export class SandforkConfig {
  constructor(
    server: IServerConfig,
    private readonly settings: ISettingRegistry.ISettings
  ) {
    this.kernels = new SandforkKernels(server.kernel_names);
    this._serverMaxBranches = server.max_branches;
    settings.changed.connect(() => this._changed.emit());
  }

  /** Emitted when the user changes a setting. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** The Sandfork kernels, as the server defines them. */
  readonly kernels: SandforkKernels;

  /** The most branch notebooks Fork offers: the user's setting, capped by the server's limit. */
  get maxBranches(): number {
    return Math.min(this.setting<number>('maxBranches'), this._serverMaxBranches);
  }

  /** Whether deleting a snapshot asks first. */
  get confirmDelete(): boolean {
    return this.setting<boolean>('confirmDelete');
  }

  /** A fork into more branch notebooks than this asks for confirmation first. */
  get confirmForkAbove(): number {
    return this.setting<number>('confirmForkAbove');
  }

  /** Whether a notebook without its own choice (metadata) checkpoints after every cell. */
  get checkpointCells(): boolean {
    return this.setting<boolean>('checkpointCells');
  }

  /** How many checkpoints a kernel keeps (its newest). */
  get checkpointsKept(): number {
    return this.setting<number>('checkpointsKept');
  }

  /** A value of the composite settings, which the schema's defaults fill in. */
  private setting<T extends number | boolean>(key: string): T {
    return this.settings.composite[key] as T;
  }

  private readonly _serverMaxBranches: number;
  private readonly _changed = new Signal<this, void>(this);
}
