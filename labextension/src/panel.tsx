import { PathExt } from '@jupyterlab/coreutils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { ReactWidget, ToolbarButtonComponent, refreshIcon } from '@jupyterlab/ui-components';
import * as React from 'react';

import { SandforkActions } from './actions';
import { IKernelSandbox, IListing, IPort, getKernelPorts, listSnapshots } from './api';
import { Details } from './details';
import { LineageEvents } from './events';
import { LineageGraph } from './graph';
import { sandforkIcon } from './icons';
import { InventoryCache } from './inspector';
import { SandforkKernels } from './kernel';
import { historyOf, layOut } from './layout';
import { Lineage, LineageNode } from './lineage';
import { Ports } from './ports';
import { errorMessage } from './progress';
import { KernelRewind } from './rewind';
import { KernelSandboxes } from './sandboxes';
import { buildTree } from './tree';
import { SnapshotTree } from './treeview';

export interface ISnapshotsPanelOptions {
  actions: SandforkActions;
  rewind: KernelRewind;
  tracker: INotebookTracker;
  kernels: SandforkKernels;
  sandboxes: KernelSandboxes;
  events: LineageEvents;
}

/** The current notebook, where its kernel is, and the servers listening there. */
interface ICurrent {
  path: string;
  kernel: IKernelSandbox | null;
  ports: IPort[] | null;
  portsError: string | null;
}

/**
 * The left side panel "Sandfork snapshots": the history graph of the current notebook
 * (graph.tsx), what is selected in it (details.tsx), and the tree of all snapshots and
 * sandboxes (treeview.tsx). It reloads when the server tells of a change (events.ts), when
 * the current notebook or its kernel changes, and on its Refresh button; while hidden, once
 * shown again.
 */
export class SnapshotsPanel extends ReactWidget {
  constructor(private readonly options: ISnapshotsPanelOptions) {
    super();
    this.id = 'sandfork-snapshots';
    this.addClass('sandfork-SnapshotsPanel');
    this.title.icon = sandforkIcon;
    this.title.caption = 'Sandfork snapshots';
    options.events.changed.connect(this.changed, this);
    options.tracker.currentChanged.connect(this.follow, this);
    this.follow();
  }

  /**
   * Loads the listing and the current notebook's kernel again. Answers are shown as they
   * come, unless a later request's came first: a stream of changes cannot starve the panel.
   */
  async refresh(): Promise<void> {
    const request = ++this._requests;
    this._loading = true;
    this.update();
    const listing = listSnapshots().then(
      answer => {
        if (request > this._listed) {
          this._listed = request;
          this.take(answer);
        }
      },
      error => {
        if (request > this._listed) {
          this._listed = request;
          this._error = errorMessage(error);
        }
      }
    );
    const current = this.loadCurrent().then(answer => {
      if (request > this._located) {
        this._located = request;
        this._current = answer;
      }
    });
    await listing;
    this.update();
    await current;
    if (request === this._requests) {
      this._loading = false;
    }
    this.update();
  }

  protected onAfterShow(): void {
    void this.refresh();
  }

  protected render(): JSX.Element {
    return (
      <>
        <div className="sandfork-SnapshotsPanel-header">
          <h2 className="sandfork-SnapshotsPanel-title">Sandfork snapshots</h2>
          <ToolbarButtonComponent
            className="sandfork-SnapshotsPanel-refresh"
            icon={refreshIcon}
            label="Refresh"
            tooltip="Reload the snapshots and sandboxes from the server"
            enabled={!this._loading}
            onClick={() => void this.refresh()}
          />
        </div>
        {this._error && <div className="sandfork-SnapshotsPanel-error">{this._error}</div>}
        {this.renderHistory()}
        {this._current?.kernel && (
          <Ports ports={this._current.ports} error={this._current.portsError} />
        )}
        <h3 className="sandfork-SnapshotsPanel-section">All snapshots</h3>
        {this._tree.length === 0 && !this._error && (
          <p className="sandfork-SnapshotsPanel-empty">
            {this._loading
              ? 'Loading…'
              : 'No snapshots yet: take one with Snapshot in a notebook on the Sandfork kernel.'}
          </p>
        )}
        <SnapshotTree tree={this._tree} actions={this.options.actions} />
      </>
    );
  }

  private renderHistory(): JSX.Element {
    const current = this._current;
    const heading = <h3 className="sandfork-SnapshotsPanel-section">History</h3>;
    if (current === null || this._lineage === null) {
      return (
        <>
          {heading}
          <p className="sandfork-SnapshotsPanel-empty">
            {current === null
              ? 'Open a notebook on a Sandfork kernel to see its history.'
              : 'Loading…'}
          </p>
        </>
      );
    }
    const kernel = current.kernel;
    const nodes = historyOf(this._lineage, kernel?.sandbox.id ?? null, kernel?.lineage ?? null);
    if (nodes.length === 0) {
      return (
        <>
          {heading}
          <p className="sandfork-SnapshotsPanel-empty">
            The kernel of {current.path} has not attached to a sandbox yet.
          </p>
        </>
      );
    }
    const selection = this._selection
      .map(id => this._lineage?.get(id))
      .filter((node): node is LineageNode => node !== undefined);
    return (
      <>
        <h3 className="sandfork-SnapshotsPanel-section" title={current.path}>
          History of {PathExt.basename(current.path)}
        </h3>
        <LineageGraph
          layout={layOut(this._lineage, nodes)}
          current={kernel?.sandbox.id ?? null}
          selected={this._selection}
          onSelect={(node, add) => this.select(node, add)}
        />
        {!nodes.some(node => node.kind === 'checkpoint') && (
          <p className="sandfork-SnapshotsPanel-empty">
            Turn Checkpoints on in the notebook toolbar to keep the kernel's state after every cell,
            and rewind to it.
          </p>
        )}
        <Details
          selection={selection}
          comparing={this._comparing}
          onCompare={comparing => {
            this._comparing = comparing;
            this.update();
          }}
          onClear={() => this.select(selection[0], false)}
          actions={this.options.actions}
          rewind={this.options.rewind}
          cache={this._cache}
        />
      </>
    );
  }

  /** A click on a node: selects it, or (with `add`, or in compare mode) compares with it. */
  private select(node: LineageNode, add: boolean): void {
    const first = this._lineage?.get(this._selection[0]);
    const compare =
      (add || this._comparing) &&
      first !== undefined &&
      first !== node &&
      first.kind !== 'sandbox' &&
      node.kind !== 'sandbox';
    this._selection = compare ? [first.id, node.id] : [node.id];
    this._comparing = false;
    this.update();
  }

  private take(listing: IListing): void {
    this._lineage = new Lineage(listing);
    this._tree = buildTree(this._lineage);
    this._error = null;
    const ids = new Set(listing.snapshots.map(snapshot => snapshot.id));
    this._cache.keep(ids);
    this._selection = this._selection.filter(id => this._lineage?.get(id) !== undefined);
  }

  /** The current notebook and its kernel's sandbox, if it is a Sandfork notebook. */
  private async loadCurrent(): Promise<ICurrent | null> {
    const panel = this._panel;
    const kernelId = this.options.kernels.kernelId(panel);
    if (panel === null || kernelId === null) {
      return null;
    }
    const path = panel.context.path;
    let kernel: IKernelSandbox;
    try {
      kernel = await this.options.sandboxes.get(kernelId);
    } catch {
      // Not attached yet, or gone: its history shows without a current position.
      return { path, kernel: null, ports: null, portsError: null };
    }
    try {
      const { ports } = await getKernelPorts(kernelId);
      return { path, kernel, ports, portsError: null };
    } catch (error) {
      return { path, kernel, ports: null, portsError: errorMessage(error) };
    }
  }

  /** Follows the current notebook and its kernel. */
  private follow(): void {
    this._panel?.sessionContext.kernelChanged.disconnect(this.changed, this);
    this._panel = this.options.tracker.currentWidget;
    this._panel?.sessionContext.kernelChanged.connect(this.changed, this);
    this._selection = [];
    this._comparing = false;
    this.changed();
  }

  /** Something shown may have changed: reload now if visible (else when shown). */
  private changed(): void {
    if (this.isVisible) {
      void this.refresh();
    }
  }

  private _panel: NotebookPanel | null = null;
  private _current: ICurrent | null = null;
  private _lineage: Lineage | null = null;
  private _tree: ReturnType<typeof buildTree> = [];
  private _selection: string[] = [];
  private _comparing = false;
  private _error: string | null = null;
  private _loading = false;
  private _requests = 0;
  private _listed = 0;
  private _located = 0;
  private readonly _cache = new InventoryCache();
}
