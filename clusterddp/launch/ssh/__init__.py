"""SSH fan-out: start the same launcher on every host of a hostfile and supervise them all.

One module per step, in the order a run goes through them:

- ``hosts``: hostfile entries + ssh_config -> the address, port, user and keys of each host
- ``connect``: one paramiko connection per host, host keys checked, TCP keepalive on
- ``stub``: the tiny program each host runs first: report facts, wait for "go", exec
- ``preflight``: every host's facts checked together; all problems reported at once
- ``remote_command``: the launcher's argv and env for one host, built, never concatenated
- ``relay``: the run's coordinator: output relayed with heartbeats; any failure stops every host
  - ``io``: each host's channel read line by line, lines relayed, heartbeats sent
  - ``teardown``: every host stopped: stdin closed, then a process-group kill over SSH
  - ``outcome``: the exit code and the host that failed first, pure functions over plain data
  - ``stacks``: one "where is each rank" round across hosts
- ``summary``: the closing report naming the root cause and every host's end
- ``fanout``: ``run_fanout(job, FanoutOptions) -> exit code``, the entry point
"""
