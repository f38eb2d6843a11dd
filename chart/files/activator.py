"""The chart's inference activator: inference.activator's HTTP front, with replicas as pods
that gpupool-scheduler places (hub_ext.serving.kubernetes.KubernetesBackend) in $GPUPOOL_NAMESPACE.
The services are the chart's values (activator.services), mounted as services.json, and
those the hub publishes (hub_ext.serving.published: one ConfigMap each, followed by a
watch; additions and removals take effect without a restart, the services' state is
written back at each change and every --poll seconds; credentials and data sources come
with each ConfigMap, their values in the Secret the hub writes). This activator owns
the replicas of all of them. ``GET /_status`` lists the services' state.

A service that is not public takes the JupyterHub token of a member of its project (or of
a platform admin): the activator asks the hub's REST API (``--hub-url``, the gpupool
service) who holds it, with its own service token ($GPUPOOL_ACTIVATOR_TOKEN), and keeps the
answer ``--auth-cache`` seconds (hub_ext.serving.auth.HubApiAuth). No token: 401; another
project's: 403.

The replica pods outlive the activator: a stop leaves them running and the next start
adopts those of the services it serves (KubernetesBackend.adopt_all); they belong to
``--owner-configmap`` (the chart's ConfigMap), so they go with the release.

    python activator.py --services services.json --hub-url URL [--port 9000]
                        [--host 0.0.0.0] [--namespace NS] [--kubeconfig FILE]
                        [--poll SECONDS] [--default-image IMAGE] [--auth-cache SECONDS]
                        [--owner-configmap NAME]
"""

import argparse
import asyncio
import json
import logging
import os
import signal
import sys

from hub_ext.requests.rules import FieldError
from hub_ext.serving.auth import HubApiAuth
from hub_ext.serving.kubernetes import WORKLOAD_IMAGE, KubernetesBackend
from hub_ext.serving.published import Follower
from hub_ext.serving.spec import parse_spec
from inference import activator
from inference.controller import Controller
from scheduler.kubernetes.client import KubeClient


async def serve(args) -> None:
    token = os.environ.get("GPUPOOL_ACTIVATOR_TOKEN", "")
    if not args.hub_url or not token:
        raise SystemExit("the activator checks callers' tokens with the hub: it needs --hub-url "
                         "and $GPUPOOL_ACTIVATOR_TOKEN (its JupyterHub service token)")
    auth = HubApiAuth(args.hub_url, token, cache_s=args.auth_cache)
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
        owner = None
        if args.owner_configmap:  # the replicas go with the release (garbage collection)
            cm = await kc.get(f"/api/v1/namespaces/{args.namespace}/configmaps/{args.owner_configmap}")
            owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": args.owner_configmap,
                     "uid": cm["metadata"]["uid"]}
        # published services' credentials and data sources come with their ConfigMaps
        backend = KubernetesBackend(kc, args.namespace, attachments=lambda spec: follower.attachments(spec),
                                    default_image=args.default_image, owner=owner)
        controller = Controller(backend, held=True)  # until the replicas that run are adopted
        for spec in specs:
            controller.put(spec)
        follower = Follower(kc, args.namespace, controller, {s.name for s in specs})
        await follower.first_sync()
        kept, found = await backend.adopt_all(controller)
        logging.info("%d of %d replica pods adopted", kept, found)
        controller.start()

        def status(req):
            return 200, "application/json", json.dumps(
                {n: s.status() for n, s in controller.services.items()}).encode()

        server = activator.Server(controller, "/", auth, local={"/_status": status})
        await server.listen(args.port, host=args.host)
        following = asyncio.ensure_future(follower.follow(args.poll))
        logging.info("activator on :%d, %d services in %s", args.port, len(specs), args.namespace)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()
        following.cancel()
        server.close()
        # the replicas keep running: the next activator adopts them (a service removed
        # meanwhile loses them then; helm uninstall deletes them with their owner)
        await controller.stop(keep_replicas=True)
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
    ap.add_argument("--hub-url", default=os.environ.get("GPUPOOL_HUB_SERVICE_URL", ""),
                    help="the gpupool service's URL (http://HUB/services/gpupool/)")
    ap.add_argument("--owner-configmap", default="",
                    help="the ConfigMap that owns the replica pods (the chart's own)")
    ap.add_argument("--auth-cache", type=float, default=30.0,
                    help="seconds a token's user and projects are kept")
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between writes of the services' state")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(serve(ap.parse_args()))


if __name__ == "__main__":
    main()
