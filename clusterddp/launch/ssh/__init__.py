"""SSH fan-out: start the same launcher on every host of a hostfile and supervise them all.

One module per concept, in the order a run meets them:

- ``fanout``: ``run_fanout(job, FanoutOptions) -> exit code``, the head's loop (``HeadLoop``) as
  named states (``HeadState``: PROBING, RUNNING, JUDGING, RELEASING, BACKING_OFF, RESUMING,
  ENDED), every step it may take listed in ``TRANSITIONS``
- ``hosts``: the hosts and their choice: hostfile entries + ssh_config -> the address, port,
  user and keys of each host (``job_hosts``); which candidates an attempt runs on
- ``attempt``: the fan-out settled once (``launch_of``: hosts, master, env) and one attempt:
  probe, choose, plan each host's launcher (its argv and env, built, never concatenated);
  whether to restart
  - ``reach``: reaching a host: one paramiko connection per host (host keys checked, TCP
    keepalive on), the stub started and probed, every host's facts checked together
    (preflight: all problems at once), the ``LaunchPlan`` each stub will exec, and the only
    two shell strings that ever reach a host (the stub's start, the fallback kill)
  - ``stub``: the tiny program each host runs first: report facts, wait for "go", exec
- ``running``: the states that act on the hosts: RUNNING (GO or the restart word to every
  host, relayed to the end, its failure reported) and RELEASING (launchers that wait for a
  word that will not come ended); ``Stop``, the head's signals
- ``relay``: output relayed with keepalives; any failure stops every host (``Teardown``:
  stdin closed, then a process-group kill over SSH)
  - ``io``: each host's channel read line by line, lines relayed, keepalives sent; ``Console``,
    the head's one ``say``
  - ``stacks``: one "where is each rank" round across hosts
- ``inplace``: whole-job restarts in place: the next attempt on the launchers that wait for
  it (``--await-restart``), no new session or interpreter
- ``outcome``: the exit code, the host that failed first and the closing report, pure
  functions over plain data
- ``headlog``: the head's record of a fan-out: its events, its restart verdict on each
  attempt (``launch.restart.verdict``, as a one-node launcher's), and the hosts' event logs
  brought to the head (``Gatherer``), so ``clusterddp report`` there covers the job

It builds on the packages below it (``restart``, ``supervise.runlock``, ``observe``) and on
``options`` and ``flags``; inside launch only ``doctor`` imports it (``cli`` hands it a run).
"""
