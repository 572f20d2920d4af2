import * as React from 'react';

import { isLive } from './actionbar';
import { formatBytes, formatClock, formatTime } from './format';
import { IGraphLayout, IPlacedNode } from './layout';
import { LineageNode } from './lineage';

const ROW_PX = 26;
const LANE_PX = 14;
const PAD_PX = 6;
/** Lane colours (CSS classes `sandfork-Graph-lane-0` …). */
const LANE_COLOURS = 5;

/** How a node is named: a snapshot's name, else "after [n]"; a sandbox's notebook. */
export function nodeLabel(node: LineageNode): string {
  if (node.kind === 'sandbox') {
    return node.sandbox.notebook_path ?? node.sandbox.id;
  }
  const { name, execution_count } = node.snapshot;
  if (name) {
    return name;
  }
  if (execution_count !== null) {
    return `after [${execution_count}]`;
  }
  return node.kind === 'checkpoint' ? 'checkpoint' : 'unnamed snapshot';
}

/** The short line beside the label, and the tooltip. */
function describe(node: LineageNode, current: boolean): [string, string] {
  if (node.kind === 'sandbox') {
    const { sandbox } = node;
    const origin = sandbox.forked_from ? 'branch' : sandbox.from_snapshot ? 'restored' : '';
    const state = current ? 'current' : isLive(sandbox) ? 'live kernel' : sandbox.status;
    const tooltip = [
      `sandbox ${sandbox.id}`,
      sandbox.notebook_path ?? 'no notebook',
      `status ${sandbox.status}`,
      sandbox.from_snapshot ? `restored from ${sandbox.from_snapshot}` : '',
      sandbox.forked_from ? `forked from ${sandbox.forked_from}` : ''
    ];
    return [[origin, state].filter(Boolean).join(' · '), tooltip.filter(Boolean).join('\n')];
  }
  const { snapshot } = node;
  const after = snapshot.execution_count !== null ? `after [${snapshot.execution_count}]` : '';
  const tooltip = [
    `${node.kind} ${snapshot.id}`,
    formatTime(snapshot.created_at),
    `${formatBytes(snapshot.size_bytes)}, paused ${snapshot.paused_ms} ms`,
    snapshot.cell_id ? `cell ${snapshot.cell_id}` : ''
  ];
  return [
    [snapshot.name ? after : '', formatClock(snapshot.created_at)].filter(Boolean).join(' · '),
    tooltip.filter(Boolean).join('\n')
  ];
}

const x = (lane: number): number => PAD_PX + lane * LANE_PX + LANE_PX / 2;
const y = (row: number): number => row * ROW_PX + ROW_PX / 2;
const laneClass = (lane: number): string => `sandfork-Graph-lane-${lane % LANE_COLOURS}`;

/** The edge from a node's parent: down the parent's lane, then curving into its own. */
function Edge({ placed }: { placed: IPlacedNode }): JSX.Element | null {
  const { parent } = placed;
  if (parent === null) {
    return null;
  }
  const [x0, y0, x1, y1] = [x(parent.lane), y(parent.row), x(placed.lane), y(placed.row)];
  const bend = Math.max(y0, y1 - ROW_PX);
  const path =
    x0 === x1
      ? `M ${x0} ${y0} V ${y1}`
      : `M ${x0} ${y0} V ${bend} C ${x0} ${(bend + y1) / 2}, ${x1} ${(bend + y1) / 2}, ${x1} ${y1}`;
  const fork = parent.node.kind === 'sandbox' && placed.node.kind === 'sandbox';
  return (
    <path
      className={`sandfork-Graph-edge ${laneClass(placed.lane)}${fork ? ' sandfork-Graph-edge-fork' : ''}`}
      d={path}
    />
  );
}

/** A node's mark: a small dot (checkpoint), a dot (snapshot) or a square (sandbox). */
function Mark(props: { placed: IPlacedNode; current: boolean; selected: boolean }): JSX.Element {
  const { node, lane, row } = props.placed;
  const [cx, cy] = [x(lane), y(row)];
  const classes = [
    'sandfork-Graph-mark',
    `sandfork-Graph-mark-${node.kind}`,
    laneClass(lane),
    node.kind === 'sandbox' ? `sandfork-Graph-mark-${node.sandbox.status}` : '',
    props.current ? 'sandfork-Graph-mark-current' : ''
  ].join(' ');
  return (
    <g>
      {props.selected && <circle className="sandfork-Graph-ring" cx={cx} cy={cy} r={9} />}
      {node.kind === 'sandbox' ? (
        <rect className={classes} x={cx - 5} y={cy - 5} width={10} height={10} rx={2} />
      ) : (
        <circle className={classes} cx={cx} cy={cy} r={node.kind === 'checkpoint' ? 3 : 5.5} />
      )}
    </g>
  );
}

export interface IGraphProps {
  layout: IGraphLayout;
  /** The sandbox of the current notebook's kernel: where it is now. */
  current: string | null;
  selected: readonly string[];
  /** A click on a node; `add`: with Ctrl, Cmd or Shift (compare with the selection). */
  onSelect: (node: LineageNode, add: boolean) => void;
}

/**
 * The history graph: an SVG of lanes and edges behind one row per node (`div.sandfork-Graph-node`
 * with `data-id` and `data-kind`), which selects the node on click.
 */
export function LineageGraph(props: IGraphProps): JSX.Element {
  const { nodes, lanes } = props.layout;
  const width = 2 * PAD_PX + Math.max(lanes, 1) * LANE_PX;
  return (
    <div className="sandfork-Graph">
      <svg
        className="sandfork-Graph-lines"
        width={width}
        height={nodes.length * ROW_PX}
        aria-hidden="true"
      >
        {nodes.map(placed => (
          <Edge key={placed.node.id} placed={placed} />
        ))}
        {nodes.map(placed => (
          <Mark
            key={placed.node.id}
            placed={placed}
            current={placed.node.id === props.current}
            selected={props.selected.includes(placed.node.id)}
          />
        ))}
      </svg>
      {nodes.map(({ node }) => {
        const current = node.id === props.current;
        const selected = props.selected.includes(node.id);
        const hibernated = node.kind === 'sandbox' && node.sandbox.status === 'hibernated';
        const [meta, tooltip] = describe(node, current);
        const classes = [
          'sandfork-Graph-node',
          `sandfork-Graph-${node.kind}`,
          current ? 'sandfork-Graph-current' : '',
          selected ? 'sandfork-Graph-selected' : '',
          hibernated ? 'sandfork-Graph-hibernated' : ''
        ];
        const select = (event: React.MouseEvent | React.KeyboardEvent): void =>
          props.onSelect(node, event.ctrlKey || event.metaKey || event.shiftKey);
        return (
          <div
            key={node.id}
            className={classes.filter(Boolean).join(' ')}
            data-id={node.id}
            data-kind={node.kind}
            role="button"
            tabIndex={0}
            aria-pressed={selected}
            title={tooltip}
            style={{ height: ROW_PX, paddingLeft: width }}
            onClick={select}
            onKeyDown={event => {
              if (event.key === 'Enter' || event.key === ' ') {
                event.preventDefault();
                select(event);
              }
            }}
          >
            <span className="sandfork-Graph-label">{nodeLabel(node)}</span>
            {meta && <span className="sandfork-Graph-meta">{meta}</span>}
          </div>
        );
      })}
    </div>
  );
}
