"""Console verbs beyond the RPC table: bootstrap, pull, decommission-check, resume-from-s3,
failures, report and s3-inventory.
Registered on the headless parser."""

from __future__ import annotations

from typing import Any


def add(sub: Any) -> None:
    from console import bootstrap

    p = sub.add_parser("bootstrap", help="install or upgrade the agent on NODE over SSH")
    p.add_argument("node_name", metavar="NODE")
    p.add_argument("--wheel", default=None, metavar="PATH",
                   help="the fleetdeck wheel to install (default: build one from the checkout "
                        "this console runs from; never downloaded by name)")
    p.set_defaults(runner=bootstrap.cmd_bootstrap)

    from console.artifacts import decommission

    p = sub.add_parser("pull", help="copy the run's artifacts here over SFTP, sha256-checked")
    p.add_argument("node_name", metavar="NODE")
    p.add_argument("--to", default=None, help="pull folder (default: [console] pull_dir)")
    p.add_argument("--all", action="store_true", help="completion batches held in S3 too")
    p.set_defaults(runner=decommission.cmd_pull)

    p = sub.add_parser("decommission-check",
                       help="exit 0 only when it is safe to give NODE back")
    p.add_argument("node_name", metavar="NODE")
    p.add_argument("--to", default=None, help="pull folder (default: [console] pull_dir)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(runner=decommission.cmd_decommission_check)

    from console import resume_from_s3

    resume_from_s3.add(sub)

    from console import failures

    failures.add(sub)

    from console.dataset import verb as dataset

    dataset.add(sub)

    from console.report import verb as report

    report.add(sub)

    from console import s3inventory

    s3inventory.add(sub)

    from console import replay

    replay.add(sub)
