"""The labeling web page (``02_label_ui.py``): a NiceGUI app over one or more segment DBs. Modules,
in the order a request meets them: ``config`` (the command line), ``auth`` (Host/Origin check,
token), ``state`` (what the server and each tab know), ``clips`` (segment -> cached MP4), ``pages``
(the frame and the Overview), ``label_page`` (Label new data), ``labels_page`` (Existing labels),
``common`` (what the pages share), ``server`` (wires and serves it, or runs oracle mode)."""
