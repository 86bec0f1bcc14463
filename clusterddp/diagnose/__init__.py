"""``clusterddp stacks``: ask a running job where each rank is.

The rest of "where is each rank" sits where its users can reach it: dump parsing, grouping
and merging in the ``stackreport`` leaf, hang arithmetic in ``hang``, the stacks rounds in
``launch``, and ``clusterddp doctor`` in ``launch.doctor`` (it is a fan-out run).
"""
