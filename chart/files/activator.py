"""The chart's inference activator: inference.activator's HTTP front, with replicas as pods
that gpupool-scheduler places (hub_ext.serving.kubernetes.KubernetesBackend) in $GPUPOOL_NAMESPACE.
The services are the chart's values (activator.services), mounted as services.json, and
those the hub publishes (hub_ext.serving.published: one ConfigMap each, followed by a
watch; additions and removals take effect without a restart, the services' state is
written back at each change and every --poll seconds; credentials and data sources come
with each ConfigMap, their values in the Secret the hub writes). This activator owns
the replicas of all of them. ``GET /_status`` lists the services' state.

    python activator.py --services services.json [--port 9000] [--host 0.0.0.0]
                        [--namespace NS] [--kubeconfig FILE] [--poll SECONDS]
                        [--default-image IMAGE]
"""

import argparse
import asyncio
import json
import logging
import os
import signal
import sys

from hub_ext.requests.rules import FieldError
from hub_ext.serving.kubernetes import WORKLOAD_IMAGE, KubernetesBackend
from hub_ext.serving.published import Follower
from hub_ext.serving.spec import parse_spec
from inference import activator
from inference.controller import Controller
from scheduler.kubernetes.client import KubeClient


async def serve(args) -> None:
    with open(args.services) as f:
        docs = json.load(f)
    specs = []
    for i, doc in enumerate(docs):
        try:
            specs.append(parse_spec(doc))
        except FieldError as e:  # a clear message naming the service and the field
            raise SystemExit(f"activator.services[{i}]: {e}") from None
    kc = await KubeClient.from_kubeconfig(args.kubeconfig)
    async with kc:
        # published services' credentials and data sources come with their ConfigMaps
        backend = KubernetesBackend(kc, args.namespace, attachments=lambda spec: follower.attachments(spec),
                                    default_image=args.default_image)
        controller = Controller(backend)
        for spec in specs:
            controller.put(spec)
        follower = Follower(kc, args.namespace, controller, {s.name for s in specs})

        def status(req):
            return 200, "application/json", json.dumps(
                {n: s.status() for n, s in controller.services.items()}).encode()

        server = activator.Server(controller, "/", local={"/_status": status})
        await server.listen(args.port, host=args.host)
        controller.start()
        following = asyncio.ensure_future(follower.follow(args.poll))
        logging.info("activator on :%d, %d services in %s", args.port, len(specs), args.namespace)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()
        following.cancel()
        server.close()
        await controller.stop()  # deletes the replicas
        await backend.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--services", required=True)
    ap.add_argument("--port", type=int, default=9000)
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--namespace", default=os.environ.get("GPUPOOL_NAMESPACE", "default"))
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    ap.add_argument("--default-image", default=WORKLOAD_IMAGE,
                    help="image of the services whose spec names none")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between writes of the services' state")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(ap.parse_args()))


if __name__ == "__main__":
    main()
