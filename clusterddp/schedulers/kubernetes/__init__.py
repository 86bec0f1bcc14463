"""Kubernetes (``k8s``): a TrainJob, JobSet or PyTorchJob rendered from the job file, handled
through kubectl.

``scheduler`` is the ``Scheduler`` and the kubectl boundary; ``render`` the pure job -> object;
``launcher`` the ConfigMap that carries the launcher and the job file into the pod;
``container`` what the job's ``container:`` section means for a pod. Nothing is imported here:
the registry (clusterddp.schedulers.SCHEDULERS) names ``scheduler`` itself.
"""
