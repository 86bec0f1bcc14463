"""OpenPAI (``openpai``): a protocol-v2 job rendered from the job file, sent over REST.

``scheduler`` is the ``Scheduler``; ``render`` the pure job -> protocol-v2 YAML; ``rest`` the
small standard-library client of OpenPAI's REST server. Nothing is imported here: the registry
(clusterddp.schedulers.SCHEDULERS) names ``scheduler`` itself.
"""
