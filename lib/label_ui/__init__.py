"""The labeling web page (``02_label_ui.py``): a NiceGUI app over one or more segment DBs.

Modules, in the order a request meets them:

- ``config``: command-line arguments and their checks (``LabelConfig``).
- ``auth``:   the Host/Origin check (DNS rebinding) and the optional token (``--token``): ASGI
              middlewares and a plain login form.
- ``state``:  what the server knows (``AppState``: DBs, their labels, reserved pairs) and what
              one browser tab knows (``TabSession``: its list of pairs, answers, undo).
- ``clips``:  segment -> H.264 MP4 clip, encoded off the event loop and cached on disk.
- ``pages``:  the shared frame (header, sub-pages) and the Overview;
  ``label_page``: Label new data (``LabelPage``: view, clip player glue, actions, key table);
  ``labels_page``: Existing labels (``LabelsPage``); ``common``: what the pages share.
- ``server``: wires it together (``build_app``), serves it (``serve``) or runs oracle mode.
"""
