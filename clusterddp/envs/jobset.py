"""A pod of a JobSet rendered by ``clusterddp render k8s --flavor jobset``.

A JobSet injects no placement variables: its pods are pods of an Indexed Job, which get
``JOB_COMPLETION_INDEX`` from the Job controller, and stable DNS names
``<jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>`` (the subdomain defaults to the
JobSet's name). So the renderer writes where node 0 is into the container's env. The contract
between the renderer and this module (one replicated job, one Job of N pods, one launcher per
pod):

====================================  =========================================================
variable                              value the renderer sets
====================================  =========================================================
``CLUSTERDDP_JOBSET_MASTER_ADDR``     ``<jobset>-<replicatedJob>-0-0.<subdomain>`` (required)
``CLUSTERDDP_JOBSET_NNODES``          N, the Job's ``parallelism`` = ``completions`` (required)
``CLUSTERDDP_JOBSET_MASTER_PORT``     the rendezvous port (optional; else ``master.port``,
                                      else a port every pod derives from the run id)
``JOB_COMPLETION_INDEX``              set by the Job controller: the node rank
``CLUSTERDDP_RESTART_COUNT``          fieldRef ``metadata.labels['jobset.sigs.k8s.io/restart-attempt']``
                                      (optional; the launcher's own ``--restart-count``
                                      variable: the workers' TORCHELASTIC_RESTART_COUNT, and
                                      the pod never restarts its workers alone)
====================================  =========================================================

Any ``CLUSTERDDP_JOBSET_*`` variable says "JobSet pod"; a pod that lacks a required one is
refused, naming it, rather than placed as a one-node local job (which would train alone, or
leave its peers waiting, without a word).

Names of their own, not ``CLUSTERDDP_MASTER_ADDR``: that one is ``--master-addr``, which places
a node by hand (node rank 0 unless ``--node-rank`` is given too) and wins over every
environment. The pod command stays ``clusterddp run JOB``, the same in every flavor.
"""

from __future__ import annotations

from clusterddp.envs.base import ClusterEnv, Placement
from clusterddp.envs.kubeflow import is_worker
from clusterddp.validate import MAX_NODES

MASTER_ADDR = "CLUSTERDDP_JOBSET_MASTER_ADDR"
NNODES = "CLUSTERDDP_JOBSET_NNODES"
MASTER_PORT = "CLUSTERDDP_JOBSET_MASTER_PORT"
#: Set by Kubernetes' Job controller in every pod of an Indexed Job.
COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
#: Any of these says the renderer made this pod: the pod is then placed here or refused here.
RENDERED = (MASTER_ADDR, NNODES, MASTER_PORT)
#: JobSet's label (and annotation) on every pod: how many times the whole set was recreated.
RESTART_ATTEMPT_LABEL = "jobset.sigs.k8s.io/restart-attempt"


class JobSetEnv(ClusterEnv):
    name = "jobset"
    looks_for = f"{MASTER_ADDR}, {NNODES} and {COMPLETION_INDEX} (JobSet pod)"

    def detected(self) -> bool:
        # A worker inherits the pod's variables; its agent's GROUP_RANK places it (TorchrunEnv).
        return self.first_var(*RENDERED) is not None and not is_worker(self.env)

    def placement(self) -> Placement:
        given = self.which(*RENDERED)
        for required in (MASTER_ADDR, NNODES):
            if self.raw_var(required) is None:
                raise self.error(required, f"not set, but {given} is: a JobSet pod needs both {MASTER_ADDR} "
                                           f"and {NNODES}", "render the JobSet with 'clusterddp render k8s "
                                           "--flavor jobset', which sets both in every pod")
        nnodes = self.int_var(NNODES, low=1, high=MAX_NODES)
        if self.raw_var(COMPLETION_INDEX) is None:
            raise self.error(COMPLETION_INDEX, f"not set, but {MASTER_ADDR} is: this pod has no node rank",
                             "run the JobSet's Job with completionMode: Indexed (clusterddp render k8s does)")
        node_rank = self.int_var(COMPLETION_INDEX, low=0, high=MAX_NODES - 1)
        if node_rank >= nnodes:
            raise self.error(COMPLETION_INDEX, f"node rank {node_rank} is outside 0..{nnodes - 1} ({NNODES}={nnodes})")
        note = (f"JobSet pod: node rank = {COMPLETION_INDEX} = {node_rank}, nodes = {NNODES} = {nnodes}, "
                f"master = {MASTER_ADDR}")
        return Placement(env=self.name, nnodes=nnodes, node_rank=node_rank, master_addr=self.host_var(MASTER_ADDR),
                         master_port=self.port_var(MASTER_PORT), run_id=self.overrides.run_id, notes=(note,))
