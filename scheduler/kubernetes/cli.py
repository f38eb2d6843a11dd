"""``gpupool-scheduler``: the Kubernetes scheduler process (console command and container
entry point). Holds the Lease, then runs the adapter until it loses the Lease or is told to
stop (SIGTERM/SIGINT release the Lease so a standby takes over at once)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shlex
import signal
import socket
import sys

from ..contract import DEFAULT_PRELOAD
from ..metrics import prometheus
from ..snapshot import SchedulerConfig
from .adapter import GpupoolScheduler
from .client import KubeClient
from .config import RESERVATION_COMMAND, AdapterConfig
from .lease import LeaderElector

__all__ = ["main", "parser"]


def core_config(args: argparse.Namespace) -> SchedulerConfig:
    """The core's switches that the command line sets."""
    return SchedulerConfig(policy=args.policy, default_topology_key=args.topology_key,
                           consolidate_in_quota=args.consolidate_in_quota == "on")


def reservation_command(text: str) -> tuple[str, ...]:
    """``--reservation-command``: split as a shell would; '' for the image's entrypoint."""
    try:
        return tuple(shlex.split(text))
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--reservation-command: {e}") from None


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="gpupool-scheduler", description=__doc__)
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"),
                    help="kubeconfig file; in-cluster configuration when unset")
    ap.add_argument("--scheduler-name", default="gpupool",
                    help="pods whose spec.schedulerName is this are ours (default gpupool)")
    ap.add_argument("--lease-namespace", default="kube-system", help="namespace of the Lease")
    ap.add_argument("--lease-name", default="gpupool-scheduler",
                    help="the Lease one active replica holds")
    ap.add_argument("--lease-duration", type=float, default=15.0, help="seconds")
    ap.add_argument("--lease-renew", type=float, default=5.0, help="seconds between renewals")
    ap.add_argument("--identity", default=f"{socket.gethostname()}_{os.getpid()}",
                    help="this replica's name in the Lease (default HOSTNAME_PID)")
    ap.add_argument("--node-pool-label", default="gpupool.io/node-pool", help="node label naming its pool")
    ap.add_argument("--preload-path", default=DEFAULT_PRELOAD,
                    help="interception library written as LD_PRELOAD into fraction ConfigMaps")
    ap.add_argument("--bind-concurrency", type=int, default=48, help="Bindings in flight at once")
    ap.add_argument("--policy", default="gpupool", help="placement policy of the core")
    ap.add_argument("--topology-key", default=None,
                    help="node label gangs prefer to share when they name none (e.g. gpupool.io/rack)")
    ap.add_argument("--consolidate-in-quota", default="on", choices=["on", "off"],
                    help="consolidation may also move trainings inside another project's quota to another node "
                         "(default on; off: never)")
    ap.add_argument("--metrics-port", type=int, default=0,
                    help="serve Prometheus metrics at :PORT/metrics (0: off); standbys serve too")
    ap.add_argument("--metrics-host", default="0.0.0.0", help="address the metrics server listens on")
    ap.add_argument("--gpu-reservations", action="store_true",
                    help="put fractions on GPUs the kubelet reserved for them (reservation pods, decision 0060)")
    ap.add_argument("--reservation-namespace", default=os.environ.get("POD_NAMESPACE", "default"),
                    help="namespace of the reservation pods (default $POD_NAMESPACE, else default)")
    ap.add_argument("--reservation-image", default="gpupool-scheduler",
                    help="image of the reservation pods (this scheduler's)")
    ap.add_argument("--reservation-service-account", default="default",
                    help="service account of the reservation pods: may patch pods in their namespace")
    ap.add_argument("--reservation-command", type=reservation_command, default=RESERVATION_COMMAND,
                    help="command of the reservation pods' container, split as a shell would "
                         f"(default: {' '.join(RESERVATION_COMMAND)!r}; '' runs the image's entrypoint)")
    ap.add_argument("-v", "--verbose", action="count", default=0, help="more log output (repeatable)")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parser().parse_args(argv)


async def _amain(args: argparse.Namespace) -> int:
    try:
        kc = await KubeClient.from_kubeconfig(args.kubeconfig, max_connections=args.bind_concurrency + 16)
    except Exception as e:  # missing file, bad YAML or CA, no in-cluster config: say which
        where = args.kubeconfig or "in-cluster configuration"
        print(f"gpupool-scheduler: cannot use --kubeconfig {where}: {e}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if args.metrics_port:
        await prometheus.serve(args.metrics_port, args.metrics_host)
    async with kc:
        elector = LeaderElector(kc, args.lease_namespace, args.lease_name, args.identity,
                                duration_s=args.lease_duration, renew_s=args.lease_renew,
                                retry_s=min(1.0, args.lease_renew))
        acquire = asyncio.create_task(elector.acquire())
        await asyncio.wait([acquire, asyncio.create_task(stop.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        if not acquire.done():
            acquire.cancel()
            return 0
        cfg = AdapterConfig(
            scheduler_name=args.scheduler_name, node_pool_label=args.node_pool_label,
            preload_path=args.preload_path, bind_concurrency=args.bind_concurrency,
            gpu_reservations=args.gpu_reservations, reservation_namespace=args.reservation_namespace,
            reservation_image=args.reservation_image,
            reservation_service_account=args.reservation_service_account,
            reservation_command=args.reservation_command,
            core=core_config(args),
        )  # fmt: skip
        sched = GpupoolScheduler(kc, cfg)
        prometheus.SNAPSHOT.watch(lambda: (sched.snap, sched.last))
        prometheus.LEADER.set(1)
        lost = asyncio.create_task(elector.lost.wait())
        run = asyncio.create_task(sched.run(stop))
        await asyncio.wait([run, lost], return_when=asyncio.FIRST_COMPLETED)
        if lost.done() and not run.done():
            logging.error("lost the lease: stopping")
            run.cancel()
            return 1
        lost.cancel()
        await run  # re-raises a crash
        await elector.release()
        logging.info("stopped: %s", dict(sched.stats))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    # uvloop: the scheduler's CPU per pod is mostly event-loop, TLS and socket work (watch
    # events, Bindings); under a burst that CPU is what keeps it behind the pod creators
    import uvloop

    return uvloop.run(_amain(args))


if __name__ == "__main__":
    sys.exit(main())
