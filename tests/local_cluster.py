"""A multi-node Ray on this machine (`ray.cluster_utils.Cluster`) that leaves the machine's other Rays alone.

`Cluster` writes its head's address to /tmp/ray/ray_current_cluster, the file through
which every plain `ray.init()` on the machine finds "the local cluster", and removes that
file on shutdown. On a machine shared by several test sessions each `ray.init()` elsewhere
would then try to join this cluster (and fail, in its own network namespace), and the
removal could take another's file. Here neither happens: the cluster lives in a temp dir of
its own and the address file is never written or removed.
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
from unittest import mock

import ray
import ray._common.utils
import ray._private.utils
from ray.cluster_utils import Cluster


@contextlib.contextmanager
def _no_address_file():
    with mock.patch.object(ray._private.utils, "write_ray_address", lambda *a, **k: None), \
            mock.patch.object(ray._common.utils, "reset_ray_address", lambda *a, **k: None):
        yield


def start_cluster(nodes: int, cpus_per_node: int) -> Cluster:
    """`nodes` raylets (the head included) of `cpus_per_node` logical CPUs each, waited for."""
    temp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths live under it
    with _no_address_file():
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": cpus_per_node, "temp_dir": temp,
                                                                "include_dashboard": False})
    cluster.temp = temp
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=cpus_per_node)
    cluster.wait_for_nodes()
    return cluster


def stop_cluster(cluster: Cluster) -> None:
    with _no_address_file():
        cluster.shutdown()
    shutil.rmtree(cluster.temp, ignore_errors=True)
