"""Starting `training` processes and watching them as a group: the one layer between a backend
(orchestrate/backends/) and a process on this machine or on an SSH host.

    command.py    a process's `training` arguments and environment, the same for every spawner
    supervise.py  a group's result and why it failed (`Reason`), the supervision loop, the restart rule
    local.py      ranks as processes on this machine
    ssh.py        ranks as SSH exec channels on hosts, with their liveness watched on the clock

To change how a rank is started (an argument, an environment variable), change command.py: both
spawners and the serving replicas read it.
"""
