import { notebookIcon } from '@jupyterlab/ui-components';
import * as React from 'react';

import { Actions, isLive, sandboxActions, snapshotActions } from './actionbar';
import { SandforkActions } from './actions';
import { ISandbox, ISnapshot } from './api';
import { formatBytes, formatMemory, formatTime } from './format';
import { snapshotIcon } from './icons';
import { ITreeNode } from './tree';

/**
 * The list of all snapshots and sandboxes (tree.ts): nested `li.sandfork-Tree-node` with
 * `data-id`, each with its row of actions.
 */
export function SnapshotTree(props: { tree: ITreeNode[]; actions: SandforkActions }): JSX.Element {
  const render = ({ node, children }: ITreeNode): JSX.Element => {
    const kind = node.kind === 'sandbox' ? 'sandbox' : 'snapshot';
    return (
      <li key={node.id} className={`sandfork-Tree-node sandfork-Tree-${kind}`} data-id={node.id}>
        {node.kind === 'sandbox' ? (
          <SandboxRow sandbox={node.sandbox} actions={props.actions} />
        ) : (
          <SnapshotRow snapshot={node.snapshot} actions={props.actions} />
        )}
        {children.length > 0 && <ul className="sandfork-Tree">{children.map(render)}</ul>}
      </li>
    );
  };
  return <ul className="sandfork-Tree">{props.tree.map(render)}</ul>;
}

function SnapshotRow(props: { snapshot: ISnapshot; actions: SandforkActions }): JSX.Element {
  const { snapshot } = props;
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
      <Actions actions={snapshotActions(props.actions, snapshot)} />
    </div>
  );
}

function SandboxRow(props: { sandbox: ISandbox; actions: SandforkActions }): JSX.Element {
  const { sandbox } = props;
  const details = [sandbox.id, sandbox.notebook_path ?? 'no notebook', `status ${sandbox.status}`];
  const state = isLive(sandbox) ? 'live kernel' : sandbox.status;
  return (
    <div className="sandfork-Tree-row" title={details.join('\n')}>
      <notebookIcon.react className="sandfork-Tree-icon" tag="span" />
      <span className="sandfork-Tree-name">{sandbox.notebook_path ?? sandbox.id}</span>
      <span className="sandfork-Tree-meta">
        {sandbox.created_at ? `${state} · ${formatTime(sandbox.created_at)}` : state}
      </span>
      <Actions actions={sandboxActions(props.actions, sandbox)} />
    </div>
  );
}
