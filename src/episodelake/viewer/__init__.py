"""The viewer: a local web app over a dataset or view, read-only (``episodelake view``, ``el.view(ds)``).

Owns the episode list (SQL filter, sort, pages), the episode page (camera
fields as WebM videos in sync, per-step plots with a cursor), the dataset page
(schema, history, statistics, histograms), the HTTP server that serves them
and its static assets (``static/``, hand-written JS and CSS: no network at run
time). See docs/viewer.md.

May import: ``core``, ``storage``, ``read``, the façade, ``integrations``,
``exporters``; never ``cli``.
"""

from .server import Viewer, ViewerLink, ViewerServer, start, view

__all__ = ["Viewer", "ViewerLink", "ViewerServer", "start", "view"]
