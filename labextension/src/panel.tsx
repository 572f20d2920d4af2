import {
  Button,
  ReactWidget,
  ToolbarButtonComponent,
  notebookIcon,
  refreshIcon
} from '@jupyterlab/ui-components';
import * as React from 'react';

import { SandforkActions, snapshotLabel } from './actions';
import { ISandbox, ISnapshot, listSnapshots } from './api';
import { formatBytes, formatMemory, formatTime } from './format';
import { sandforkIcon, snapshotIcon } from './icons';
import { errorMessage } from './progress';
import { TreeNode, buildTree } from './tree';

interface IAction {
  name: string;
  label: string;
  title: string;
  run: () => void;
}

function Actions(props: { actions: IAction[] }): JSX.Element {
  return (
    <span className="sandfork-Tree-actions">
      {props.actions.map(action => (
        <Button
          key={action.name}
          minimal
          small
          className="sandfork-Tree-action"
          data-action={action.name}
          title={action.title}
          onClick={action.run}
        >
          {action.label}
        </Button>
      ))}
    </span>
  );
}

/**
 * The left side panel "Sandfork snapshots": the snapshot/branch tree of `GET snapshots`,
 * with actions per node. It refreshes when shown, on its Refresh button and after every
 * operation.
 */
export class SnapshotsPanel extends ReactWidget {
  constructor(private readonly actions: SandforkActions) {
    super();
    this.id = 'sandfork-snapshots';
    this.addClass('sandfork-SnapshotsPanel');
    this.title.icon = sandforkIcon;
    this.title.caption = 'Sandfork snapshots';
    actions.changed.connect(() => void this.refresh());
  }

  async refresh(): Promise<void> {
    const request = ++this._requests;
    this._loading = true;
    this.update();
    let tree: TreeNode[] | null = null;
    let error: string | null = null;
    try {
      tree = buildTree(await listSnapshots());
    } catch (caught) {
      error = errorMessage(caught);
    }
    if (request === this._requests) {
      this._tree = tree ?? this._tree;
      this._error = error;
      this._loading = false;
      this.update();
    }
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
        {this._tree.length === 0 && !this._error && (
          <p className="sandfork-SnapshotsPanel-empty">
            {this._loading
              ? 'Loading…'
              : 'No snapshots yet: take one with Snapshot in a notebook on the Sandfork kernel.'}
          </p>
        )}
        <ul className="sandfork-Tree">{this._tree.map(node => this.renderNode(node))}</ul>
      </>
    );
  }

  private renderNode(node: TreeNode): JSX.Element {
    const row =
      node.kind === 'snapshot'
        ? this.renderSnapshot(node.snapshot)
        : this.renderSandbox(node.sandbox);
    const key = node.kind === 'snapshot' ? node.snapshot.id : node.sandbox.id;
    return (
      <li key={key} className={`sandfork-Tree-node sandfork-Tree-${node.kind}`} data-id={key}>
        {row}
        {node.children.length > 0 && (
          <ul className="sandfork-Tree">{node.children.map(child => this.renderNode(child))}</ul>
        )}
      </li>
    );
  }

  private renderSnapshot(snapshot: ISnapshot): JSX.Element {
    const actions = this.actions;
    const details = [
      snapshot.id,
      snapshot.notebook_path ? `notebook ${snapshot.notebook_path}` : 'no notebook',
      `memory ${formatMemory(snapshot.memory_mb)}, paused ${snapshot.paused_ms} ms`
    ];
    return (
      <div className="sandfork-Tree-row" title={details.join('\n')}>
        <snapshotIcon.react className="sandfork-Tree-icon" tag="span" />
        <span className="sandfork-Tree-name">{snapshot.name ?? 'unnamed snapshot'}</span>
        <span className="sandfork-Tree-meta">
          {formatTime(snapshot.created_at)} · {formatBytes(snapshot.size_bytes)}
        </span>
        <Actions
          actions={[
            {
              name: 'restore',
              label: 'Restore',
              title: `Restore ${snapshotLabel(snapshot)} into a new notebook`,
              run: () => void actions.restore(snapshot)
            },
            {
              name: 'rename',
              label: 'Rename',
              title: 'Rename this snapshot',
              run: () => void actions.rename(snapshot)
            },
            {
              name: 'delete',
              label: 'Delete',
              title: 'Delete this snapshot',
              run: () => void actions.remove(snapshot)
            },
            {
              name: 'copy-id',
              label: 'Copy ID',
              title: `Copy ${snapshot.id} to the clipboard`,
              run: () => actions.copyId(snapshot.id)
            }
          ]}
        />
      </div>
    );
  }

  private renderSandbox(sandbox: ISandbox): JSX.Element {
    const actions = this.actions;
    const live = sandbox.kernel_id !== null && sandbox.status === 'running';
    const forkable: IAction[] =
      live && sandbox.notebook_path !== null
        ? [
            {
              name: 'fork',
              label: 'Fork',
              title: 'Fork this live sandbox into branch notebooks',
              run: () => void actions.forkSandbox(sandbox)
            }
          ]
        : [];
    const details = [
      sandbox.id,
      sandbox.notebook_path ?? 'no notebook',
      `status ${sandbox.status}`
    ];
    const state = live ? 'live kernel' : sandbox.status;
    return (
      <div className="sandfork-Tree-row" title={details.join('\n')}>
        <notebookIcon.react className="sandfork-Tree-icon" tag="span" />
        <span className="sandfork-Tree-name">{sandbox.notebook_path ?? sandbox.id}</span>
        <span className="sandfork-Tree-meta">
          {sandbox.created_at ? `${state} · ${formatTime(sandbox.created_at)}` : state}
        </span>
        <Actions
          actions={[
            ...forkable,
            {
              name: 'copy-id',
              label: 'Copy ID',
              title: `Copy ${sandbox.id} to the clipboard`,
              run: () => actions.copyId(sandbox.id)
            }
          ]}
        />
      </div>
    );
  }

  private _tree: TreeNode[] = [];
  private _error: string | null = null;
  private _loading = false;
  private _requests = 0;
}
