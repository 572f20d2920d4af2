import { LabIcon } from '@jupyterlab/ui-components';

import branchSvg from '../style/icons/sandfork.svg';
import cameraSvg from '../style/icons/camera.svg';

/** The Sandfork glyph, a branch: side panel tab, Fork, status bar. */
export const sandforkIcon = new LabIcon({ name: 'sandfork:branch', svgstr: branchSvg });

/** Snapshot. */
export const snapshotIcon = new LabIcon({ name: 'sandfork:snapshot', svgstr: cameraSvg });
