"""SSH fan-out: start the same launcher on every host of a hostfile and supervise them all.

One module per concept, in the order a run meets them:

- ``fanout``: ``run_fanout(job, FanoutOptions) -> exit code``, the head's run: attempts, and in
  each one the hosts started (``io.start_hosts``: GO to every stub) then relayed to the end
- ``hosts``: the hosts and their choice: hostfile entries + ssh_config -> the address, port,
  user and keys of each host; which candidates an attempt runs on
- ``attempt``: one attempt: probe, choose, plan each host's launcher; whether to restart
  - ``connect``: one paramiko connection per host, host keys checked, TCP keepalive on
  - ``stub``: the tiny program each host runs first: report facts, wait for "go", exec
  - ``preflight``: every host's facts checked together; all problems reported at once
  - ``remote_command``: the launcher's argv and env for one host, built, never concatenated
- ``relay``: output relayed with heartbeats; any failure stops every host
  - ``io``: each host's channel read line by line, lines relayed, heartbeats sent; ``Console``,
    the head's one ``say``
  - ``teardown``: every host stopped: stdin closed, then a process-group kill over SSH
  - ``stacks``: one "where is each rank" round across hosts
- ``outcome``: the exit code, the host that failed first and the closing report, pure
  functions over plain data
"""
