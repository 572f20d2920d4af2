import { IListing, ISandbox, ISnapshot, SnapshotKind } from './api';

export interface ISandboxNode {
  kind: 'sandbox';
  id: string;
  sandbox: ISandbox;
}

export interface ISnapshotNode {
  kind: SnapshotKind;
  id: string;
  snapshot: ISnapshot;
}

/** A snapshot (a checkpoint or a snapshot proper) or a sandbox of the listing. */
export type LineageNode = ISandboxNode | ISnapshotNode;

/** When it was made ('' when unknown: a sandbox that is gone). */
export function createdAt(node: LineageNode): string {
  return (node.kind === 'sandbox' ? node.sandbox.created_at : node.snapshot.created_at) ?? '';
}

/**
 * The snapshots and sandboxes of `GET snapshots` as a forest, each node with at most one
 * parent: a snapshot's is the sandbox it was taken of (else, when that is not listed, the
 * snapshot that sandbox came from); a sandbox's, the sandbox it was forked from, else the
 * snapshot it was restored from. Nodes whose parent is not listed are roots.
 */
export class Lineage {
  constructor(listing: IListing) {
    for (const sandbox of listing.sandboxes) {
      this._nodes.set(sandbox.id, { kind: 'sandbox', id: sandbox.id, sandbox });
    }
    for (const snapshot of listing.snapshots) {
      // Before the back end knew kinds, every snapshot was one proper.
      const kind = snapshot.kind ?? 'snapshot';
      this._nodes.set(snapshot.id, { kind, id: snapshot.id, snapshot });
    }
    for (const node of this._nodes.values()) {
      this._parents.set(node.id, this.findParent(node));
    }
    this.breakCycles();
    for (const node of this._nodes.values()) {
      const parent = this.parent(node);
      if (parent) {
        const siblings = this._children.get(parent.id) ?? [];
        siblings.push(node);
        this._children.set(parent.id, siblings);
      }
    }
  }

  get nodes(): IterableIterator<LineageNode> {
    return this._nodes.values();
  }

  get(id: string | null | undefined): LineageNode | undefined {
    return id ? this._nodes.get(id) : undefined;
  }

  parent(node: LineageNode): LineageNode | null {
    return this._parents.get(node.id) ?? null;
  }

  children(node: LineageNode): readonly LineageNode[] {
    return this._children.get(node.id) ?? [];
  }

  private findParent(node: LineageNode): LineageNode | null {
    const parent =
      node.kind === 'sandbox'
        ? this.get(node.sandbox.forked_from) || this.get(node.sandbox.from_snapshot)
        : this.get(node.snapshot.sandbox_id) || this.get(node.snapshot.parent_id);
    return parent ?? null;
  }

  /** Ids that point at each other in a circle (bad data) must not hang the walks up. */
  private breakCycles(): void {
    for (const start of this._nodes.values()) {
      const seen = new Set<LineageNode>([start]);
      for (let node = start, up = this.parent(node); up; node = up, up = this.parent(up)) {
        if (seen.has(up)) {
          this._parents.set(node.id, null);
          break;
        }
        seen.add(up);
      }
    }
  }

  private readonly _nodes = new Map<string, LineageNode>();
  private readonly _parents = new Map<string, LineageNode | null>();
  private readonly _children = new Map<string, LineageNode[]>();
}
