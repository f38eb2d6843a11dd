"""What the hub follows in the cluster when ``Gpupool.backend`` is kubernetes: the
organisation (hub_ext.cluster.org) and the inventory (hub_ext.cluster.inventory)."""

from __future__ import annotations

import logging

from ..config import Gpupool
from .inventory import InventorySync
from .org import OrgSync, client

log = logging.getLogger("gpupool.k8s")


async def follow(cfg: Gpupool, Session) -> tuple[OrgSync, InventorySync]:
    try:
        kc = await client(cfg.kubeconfig)
    except Exception:
        log.exception("gpupool: cannot reach the Kubernetes API server (Gpupool.kubeconfig = %r)",
                      cfg.kubeconfig)
        raise
    org, inventory = OrgSync(kc, Session), InventorySync(kc, Session, cfg.namespace)
    org.start()
    inventory.start()
    return org, inventory
