import * as React from 'react';

import { IPort } from './api';

export interface IPortsProps {
  /** Null while loading, or when they could not be listed (`error` says why). */
  ports: IPort[] | null;
  error: string | null;
}

/**
 * The servers listening in the current notebook's sandbox (a Dash or Streamlit app, a
 * `python -m http.server`), each a link that opens it in a new browser tab through this
 * Jupyter server (behind its login): `{base_url}sandfork/sandboxes/{id}/ports/{port}/`.
 */
export function Ports({ ports, error }: IPortsProps): JSX.Element {
  let body: JSX.Element;
  if (error !== null) {
    body = <p className="sandfork-SnapshotsPanel-empty">{error}</p>;
  } else if (ports === null) {
    body = <p className="sandfork-SnapshotsPanel-empty">Loading…</p>;
  } else if (ports.length === 0) {
    body = (
      <p className="sandfork-SnapshotsPanel-empty">
        No server listens in this sandbox. Start one (a web app on a port) and refresh.
      </p>
    );
  } else {
    body = (
      <ul className="sandfork-Ports">
        {ports.map(({ port, url }) => (
          <li key={port}>
            <a
              className="sandfork-Ports-link"
              href={url}
              target="_blank"
              rel="noopener noreferrer"
              title={`Open the server on port ${port} of this sandbox in a new tab`}
            >
              Port {port}
            </a>
          </li>
        ))}
      </ul>
    );
  }
  return (
    <>
      <h3 className="sandfork-SnapshotsPanel-section">Servers in this sandbox</h3>
      {body}
    </>
  );
}
