"""Pulumi entry (`main: infra/`). The program is issue #7's work; until then it refuses plainly."""

raise SystemExit("the Pulumi program for trial clusters is not built yet (issue #7); "
                 "use `orchestrate run ARM` on the embedded local cluster")
