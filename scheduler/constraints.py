"""Which nodes a pod may run on, apart from room: node selector, required node affinity,
taints and tolerations, with kube-scheduler's meaning (its NodeAffinity and TaintToleration
filters). Pure data and pure functions: an adapter reads them off its pods and nodes, the
core asks ``allows`` once per node and distinct constraint (``ClusterArrays.allowed``).

Which of those nodes a pod prefers: preferred node affinity, scored as kube-scheduler's
NodeAffinity score plugin does (the sum of the weights of the preferred terms a node
matches); the core asks ``preference`` once per node and distinct constraint
(``ClusterArrays.preference``) and places on the best-scored nodes that have room first.

Constraints are frozen and compare by value, so equal constraints of thousands of pods are
one cache key: the nodes they allow are worked out once per set of nodes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

__all__ = ["NO_CONSTRAINTS", "NodeConstraints", "Requirement", "Taint", "Term", "Toleration", "unavailable"]

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
# Effects a pod must tolerate to be placed on a node (PreferNoSchedule is only a preference).
HARD_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Requirement:
    """One ``matchExpressions`` (on labels) or ``matchFields`` (on ``metadata.name``) entry."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        op, have = self.operator, labels.get(self.key)
        if op == "Exists":
            return have is not None
        if op == "DoesNotExist":
            return have is None
        if op == "In":
            return have is not None and have in self.values
        if op == "NotIn":
            return have is None or have not in self.values
        # Gt, Lt: the label and the one value read as integers; unreadable never matches
        try:
            n, bound = int(have or ""), int(self.values[0])
        except (ValueError, IndexError):
            return False
        return n > bound if op == "Gt" else n < bound


@dataclass(frozen=True)
class Term:
    """One ``nodeSelectorTerms`` entry: all of its requirements hold."""

    labels: tuple[Requirement, ...] = ()
    fields: tuple[Requirement, ...] = ()  # on metadata.name, the only field a term may name

    def matches(self, name: str, labels: dict[str, str]) -> bool:
        if not self.labels and not self.fields:
            return False  # an empty term matches no node (as in kube-scheduler)
        return (all(r.matches(labels) for r in self.labels)
                and all(r.matches({"metadata.name": name}) for r in self.fields))


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"

    def __str__(self) -> str:
        return f"{{{self.key}: {self.value}}}" if self.value else f"{{{self.key}}}"


@dataclass(frozen=True)
class Toleration:
    key: str = ""  # empty with Exists: every key
    operator: str = "Equal"  # Equal or Exists
    value: str = ""
    effect: str = ""  # empty: every effect

    def tolerates(self, t: Taint) -> bool:
        if self.effect and self.effect != t.effect:
            return False
        if self.key and self.key != t.key:
            return False
        if self.operator == "Exists":
            return True
        return bool(self.key) and self.value == t.value


@dataclass(frozen=True)
class NodeConstraints:
    """What a pod asks of a node's labels, name and taints."""

    selector: tuple[tuple[str, str], ...] = ()  # nodeSelector: every label equal
    terms: tuple[Term, ...] | None = None  # required node affinity: any term; None: none given
    tolerations: tuple[Toleration, ...] = ()
    # The node affinity of the pod's volumes (a PersistentVolume's, a StorageClass's allowed
    # topologies): every group holds, each by any of its terms.
    volumes: tuple[tuple[Term, ...], ...] = ()
    # preferred node affinity: (weight 1-100, term); a node scores the sum of the weights
    # of the terms it matches (an empty term matches none, as in kube-scheduler)
    preferred: tuple[tuple[int, Term], ...] = ()

    def __hash__(self) -> int:
        # Kept once worked out: the constraints are part of cache keys asked for every
        # placement, and hashing the nested tuples each time would cost more than the lookup.
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.selector, self.terms, self.tolerations, self.volumes, self.preferred))
            object.__setattr__(self, "_hash", h)
        return h

    def preference(self, name: str, labels: dict[str, str]) -> int:
        """kube-scheduler's NodeAffinity score of a node, before normalising: the summed
        weights of the preferred terms it matches."""
        return sum(w for w, t in self.preferred if t.matches(name, labels))

    def untolerated(self, taints: tuple[Taint, ...]) -> Taint | None:
        """The first taint of a node that keeps this pod off it."""
        for t in taints:
            if t.effect in HARD_EFFECTS and not any(tol.tolerates(t) for tol in self.tolerations):
                return t
        return None

    def matches_node(self, name: str, labels: dict[str, str]) -> bool:
        """nodeSelector and required node affinity."""
        if any(labels.get(k) != v for k, v in self.selector):
            return False
        return self.terms is None or any(t.matches(name, labels) for t in self.terms)

    def matches_volumes(self, name: str, labels: dict[str, str]) -> bool:
        return all(any(t.matches(name, labels) for t in group) for group in self.volumes)

    def allows(self, name: str, labels: dict[str, str], taints: tuple[Taint, ...]) -> bool:
        return (self.matches_node(name, labels) and self.untolerated(taints) is None
                and self.matches_volumes(name, labels))


NO_CONSTRAINTS = NodeConstraints()


def unavailable(c: NodeConstraints, nodes: list[tuple[str, dict[str, str], tuple[Taint, ...]]]) -> str:
    """kube-scheduler's sentence for a pod no node allows: "0/3 nodes are available:
    2 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint
    {gpu: true}." (each node counted under the first filter it fails)."""
    why: Counter[str] = Counter()
    for name, labels, taints in nodes:
        if not c.matches_node(name, labels):
            why["node(s) didn't match Pod's node affinity/selector"] += 1
        elif (t := c.untolerated(taints)) is not None:
            why[f"node(s) had untolerated taint {t}"] += 1
        elif not c.matches_volumes(name, labels):
            why["node(s) had volume node affinity conflict"] += 1
    parts = ", ".join(f"{n} {text}" for text, n in sorted(why.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"0/{len(nodes)} nodes are available: {parts}." if parts else f"0/{len(nodes)} nodes are available."
