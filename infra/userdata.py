"""The boot script every host runs: same read-ahead on every host, the on-host deadline check (second
line behind the cloud's sweep), and — on isolated-zone hosts — the cumulative transfer guard.

Why a check and not a calendar timer: systemd takes an `OnCalendar=` date that has passed as having no next
elapse (`src/core/timer.c`), so a host that first boots after the deadline, or is started again after its
timer fired, would never be stopped by it. The check runs at every boot and every minute after (monotonic
timers, which fire after each boot): past the deadline it powers the host off (= stop) unless the instance's
`trial-grace` tag, read through the instance metadata, grants a grace the same rule as the cloud's sweep
honours (infra/sweep.py: begun, not over, no longer than the stack's cap; only the exact `<ISO>Z/<ISO>Z` form,
never a date `date -d` would make of other words). Metadata it cannot read is no grace: the host stops. The
deadline and the cap come from the instance's `trial-deadline` and `trial-grace-cap-seconds` tags, which Pulumi
updates in place when the stack's change (the boot script is never re-run: `ignore_changes`), else from what
the boot script wrote.

Why two transfer guards: a CloudWatch alarm sees only per-period sums, so it cannot bound a total
since boot; with a one-hour period and the whole guard as its threshold it never fires on traffic
that stays within the guard, yet it stops the instance from outside even when the host is wedged or
its own guard died. The on-host guard reads the kernel's counters (receive + transmit on every
non-loopback interface since boot, /proc/net/dev) every 15 s and powers the host off (which stops
it: instance_initiated_shutdown_behavior = stop) when the total reaches the limit. Counters restart
at boot, so the guard keeps the total it has seen in /var/lib/trial-guard/ across a stop/start.
"""

from __future__ import annotations

import datetime as dt
import shlex


GUARD_FRACTION = 0.9
"""The share of an isolated host's transfer guard at which the controller stops the group (it stops
ranks by pid and keeps their checkpoints, where the host's own guard at 100 % powers the host off).
One number: `plan` checks the planned traffic against it, the program exports it to the controller and
writes it on the host, whose guard logs once when its count passes it."""


# Testable as it is: the paths and the stop command can be pointed elsewhere by the environment.
NETDEV_SUM = r"""awk 'NR>2 {sub(/^[ \t]+/, ""); split($0, f, /[: \t]+/); if (f[1] != "lo") s += f[2] + f[10]}
           END {printf "%.0f", s}'"""
"""rx + tx bytes of every interface but loopback, from /proc/net/dev (given as its argument)."""

GUARD_SCRIPT = r"""#!/bin/bash
set -euo pipefail
LIMIT=${TRIAL_GUARD_LIMIT:?}
state=${TRIAL_GUARD_STATE:-/var/lib/trial-guard}
netdev=${TRIAL_NETDEV:-/proc/net/dev}
boot=$(cat "${TRIAL_BOOT_ID:-/proc/sys/kernel/random/boot_id}")
# names longer than 6 characters are not right-aligned, and big counters touch the colon: split both
now=$(""" + NETDEV_SUM + r""" "$netdev")
if [ "$(cat "$state/boot" 2>/dev/null)" != "$boot" ]; then
  carried=$(( $(cat "$state/carried" 2>/dev/null || echo 0) + $(cat "$state/last" 2>/dev/null || echo 0) ))
  echo "$carried" > "$state/carried"; echo "$boot" > "$state/boot"
fi
echo "$now" > "$state/last"
total=$(( $(cat "$state/carried") + now ))
echo "$total" > "$state/total"
SOFT=${TRIAL_GUARD_SOFT:-0}  # the controller's stop (GUARD_FRACTION of the limit): said once, on the host too
if [ "$SOFT" -gt 0 ] && [ "$total" -ge "$SOFT" ] && [ ! -e "$state/soft-passed" ]; then
  logger -t trial-transfer-guard "$total bytes >= $SOFT: past the controller's stop" || true
  echo "$total" > "$state/soft-passed"
fi
if [ "$total" -ge "$LIMIT" ]; then
  logger -t trial-transfer-guard "$total bytes >= $LIMIT: stopping" || true
  ${TRIAL_STOP_COMMAND:-/sbin/shutdown -h now}
fi
"""


DEADLINE_CHECK = r"""#!/bin/bash
set -uo pipefail
state=${TRIAL_GUARD_STATE:-/var/lib/trial-guard}
imds=${TRIAL_IMDS:-http://169.254.169.254}
now=${TRIAL_NOW:-$(date -u +%s)}
iso='[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(Z|[+-]00:00)'
token=$(curl -sf -m 2 -X PUT "$imds/latest/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 60") || token=""
tag() {  # an instance tag through the metadata; empty when it cannot be read
  [ -n "$token" ] && curl -sf -m 2 -H "X-aws-ec2-metadata-token: $token" "$imds/latest/meta-data/tags/instance/$1" || true
}
# the deadline and the cap as the stack has them now (its tags: a moved deadline reaches the host), else as at boot
deadline=$(tag trial-deadline); [[ "$deadline" =~ ^$iso$ ]] || deadline=$(cat "$state/deadline")
cap=$(tag trial-grace-cap-seconds); [[ "$cap" =~ ^[0-9]{1,6}$ ]] || cap=$(cat "$state/grace-cap-seconds" 2>/dev/null || echo 0)
dl=$(date -u -d "$deadline" +%s 2>/dev/null || echo 0)
[ "$now" -lt "$dl" ] && exit 0
grace=$(tag trial-grace)
if [[ "$grace" =~ ^($iso)/($iso)$ ]]; then
  start=$(date -u -d "${grace%%/*}" +%s 2>/dev/null || echo 0)
  end=$(date -u -d "${grace#*/}" +%s 2>/dev/null || echo 0)
  if [ "$start" -gt 0 ] && [ "$start" -le "$now" ] && [ "$now" -lt "$end" ] && [ $((end - start)) -le "$cap" ]; then
    echo "inside the grace until ${grace#*/}" > "$state/deadline-check"
    exit 0
  fi
fi
logger -t trial-deadline "past the deadline $deadline and in no grace: stopping" || true
echo "stopping at $now" > "$state/deadline-check"
${TRIAL_STOP_COMMAND:-/sbin/shutdown -h now}
"""
"""Past the deadline and in no grace: power off. Testable as it is: the clock, the metadata's address, the state
folder and the stop command can be pointed elsewhere by the environment."""


def user_data(*, trial: str, rank: int, deadline: dt.datetime, read_ahead_kib: int,
              transfer_guard_bytes: float | None, login_user: str = "ubuntu", workdir: str = "/opt/trial",
              guard_fraction: float = GUARD_FRACTION, grace_cap_minutes: float = 0) -> str:
    sectors = read_ahead_kib * 2  # blockdev counts 512-byte sectors
    lines = [
        "#!/bin/bash",
        "set -euo pipefail",
        f"# trial {shlex.quote(trial)}, rank {rank}",
        "mkdir -p /var/lib/trial-guard",
        f"echo {rank} > /var/lib/trial-guard/rank",
        "# the trial's working directory, on the root (large) volume, the login user's own: staging writes there",
        f"install -d -m 0755 -o {shlex.quote(login_user)} -g {shlex.quote(login_user)} {shlex.quote(workdir)}",
        "# the same read-ahead for every arm, on every block device",
        "for dev in /sys/block/nvme*n1 /sys/block/xvd*; do",
        "  [ -e \"$dev\" ] || continue",
        f"  blockdev --setra {sectors} \"/dev/$(basename \"$dev\")\" || true",
        "done",
        "# second line behind the cloud's sweep: at every boot and every minute, past the deadline and in no",
        "# grace, power off (= stop); unit files, so the timer survives a stop/start (user data runs once)",
        f"echo {shlex.quote(deadline.isoformat())} > /var/lib/trial-guard/deadline",
        f"echo {int(grace_cap_minutes * 60)} > /var/lib/trial-guard/grace-cap-seconds",
        "cat > /usr/local/sbin/trial-deadline-check <<'CHECK'",
        DEADLINE_CHECK.rstrip(),
        "CHECK",
        "chmod 755 /usr/local/sbin/trial-deadline-check",
        *_unit("trial-deadline", "/usr/local/sbin/trial-deadline-check",
               "OnBootSec=20s\\nOnUnitActiveSec=60s\\nAccuracySec=1s"),
    ]
    if transfer_guard_bytes is not None:
        limit = int(transfer_guard_bytes)
        lines += [
            "# cumulative transfer guard: receive + transmit since first boot",
            "cat > /usr/local/sbin/trial-transfer-guard <<'GUARD'",
            GUARD_SCRIPT.replace("LIMIT=${TRIAL_GUARD_LIMIT:?}", f"LIMIT=${{TRIAL_GUARD_LIMIT:-{limit}}}")
            .replace("SOFT=${TRIAL_GUARD_SOFT:-0}", f"SOFT=${{TRIAL_GUARD_SOFT:-{int(limit * guard_fraction)}}}").rstrip(),
            "GUARD",
            "chmod 755 /usr/local/sbin/trial-transfer-guard",
            *_unit("trial-transfer-guard", "/usr/local/sbin/trial-transfer-guard",
                   "OnBootSec=15s\\nOnUnitActiveSec=15s\\nAccuracySec=1s"),
            f"echo {limit} > /var/lib/trial-guard/limit",
            f"echo {guard_fraction!r} > /var/lib/trial-guard/fraction",
        ]
    return "\n".join(lines) + "\n"


def _unit(name: str, command: str, timer: str) -> list[str]:
    return [
        f"printf '[Unit]\\nDescription={name}\\n[Service]\\nType=oneshot\\nExecStart={command}\\n' "
        f"> /etc/systemd/system/{name}.service",
        f"printf '[Unit]\\nDescription={name}\\n[Timer]\\n{timer}\\n[Install]\\nWantedBy=timers.target\\n' "
        f"> /etc/systemd/system/{name}.timer",
        "systemctl daemon-reload",
        f"systemctl enable --now {name}.timer",
    ]
