"""The code travels with the job: a tree on the head, the same bytes on every host.

Standard library only (``store`` runs on the hosts as ``python -c``, where clusterddp may not
be importable); a leaf of the layers (docs/architecture.md). In the order a run meets them:

- ``ignore``: which paths stay home: the subset of gitignore(5) that trees use, implemented
  here (no git needed, and ``code.exclude`` in the same syntax)
- ``walk``: the tree walked, the size guard (naming the biggest entries), every file hashed
  by content into a manifest whose sha256 is the tree's hash (``Tree``); what cannot be
  shipped (a link out of the tree, a FIFO, an unreadable or changing file) is one line
- ``gitstate``: the git commit and uncommitted diff (scrubbed) for the run record
- ``transfer``: the head's side of one shipment over a byte stream (``ship``), and where a
  head path lands in the shipped tree (``shipped_path``)
- ``store``: the host's side: a content-addressed cache (blobs by sha256, read-only, fixed
  mtime), only the missing blobs received, the tree built from hard links and renamed into
  ``trees/HASH`` whole, checked against the hash before it is used
"""
