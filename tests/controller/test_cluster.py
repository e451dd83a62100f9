"""A search on a real multi-node Ray (`ray.cluster_utils.Cluster`: a head and two worker nodes on loopback).

The driver is the real CLI in a subprocess joining the cluster by address; evaluations
cost a fixed time (benchmarks/fixed_cost.py). Every node's evaluators get work and the
archive names the node of each evaluation; a node removed mid-run and one added leave
an archive with the whole budget, each program once, and work on the new node.
"""
import time
from pathlib import Path

import pytest

from store.query import QueryError, run_query
from tests.controller.runs import ROOT, atoll, counts, kill_group, start
from tests.local_cluster import start_cluster, stop_cluster

CONFIG = ROOT / "benchmarks" / "fixed_cost.toml"


@pytest.fixture(scope="module")
def cluster():
    """Three nodes of one CPU each, in a temp dir of their own (the machine's other Rays are untouched)."""
    cluster = start_cluster(3, 1)
    yield cluster
    stop_cluster(cluster)


def _node_ids(cluster) -> set[str]:
    return {node.node_id for node in [cluster.head_node, *cluster.worker_nodes]}


def _per_node(run_dir) -> dict[str, int]:
    _, rows, _ = run_query(run_dir, "SELECT node_id, count(*) FROM evaluations WHERE split = 'search' GROUP BY 1")
    return dict(rows)


def _run_args(cluster, run_dir, budget: int, cost_s: float) -> list:
    return ["run", CONFIG, "--run-dir", run_dir, "--ray-address", cluster.address, "--no-report",
            "--set", f"run.max_evals={budget}", "--set", f"domain.options.cost_s={cost_s}"]


def test_a_runs_evaluations_land_on_every_node(cluster, tmp_path):
    run_dir = tmp_path / "run"
    out = atoll(tmp_path, *_run_args(cluster, run_dir, 24, 0.3), timeout=120)
    assert out.returncode == 0, out.stderr
    per_node = _per_node(run_dir)
    assert set(per_node) == _node_ids(cluster), per_node  # one evaluator per CPU, one CPU per node
    assert sum(per_node.values()) == 24
    _, rows, _ = run_query(run_dir, "SELECT count(DISTINCT node_ip), count(*) FILTER (WHERE node_ip IS NULL) "
                                    "FROM evaluations")
    assert rows == [(1, 0)]  # every node is on loopback here
    shared = Path("/tmp/ray/ray_current_cluster")  # where every plain ray.init() on the machine looks
    assert not shared.exists() or shared.read_text().strip() != cluster.address


@pytest.mark.slow
def test_a_node_lost_and_a_node_added_mid_run_leave_a_whole_archive(cluster, tmp_path):
    run_dir = tmp_path / "run"
    before = _node_ids(cluster)
    budget = 100  # room for the added node's evaluator to start (seconds on a loaded machine) and work
    proc = start(tmp_path, *_run_args(cluster, run_dir, budget, 0.4))
    try:
        _wait(lambda: counts(run_dir)[0] >= 8, proc)
        lost = next(iter(cluster.worker_nodes))
        cluster.remove_node(lost, allow_graceful=False)  # its actors and their sandboxes die with it
        _wait(lambda: counts(run_dir)[0] >= 16, proc)
        added = cluster.add_node(num_cpus=1)
        _, err = proc.communicate(timeout=150)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, err
    total, distinct = counts(run_dir)
    assert total == distinct == budget  # the whole budget, each program once
    per_node = _per_node(run_dir)
    assert per_node.get(added.node_id, 0) > 0, per_node  # the new node got an evaluator and work
    assert set(per_node) <= before | {added.node_id}
    _, rows, _ = run_query(run_dir, "SELECT count(*) FROM events WHERE kind = 'actor-lost'")
    assert rows[0][0] >= 1  # the lost node's evaluator was replaced, its jobs requeued
    _, rows, _ = run_query(run_dir, "SELECT status FROM runs")
    assert rows == [("completed",)]


def _wait(condition, proc, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended early: {proc.communicate()}"
        try:
            if condition():
                return
        except QueryError:  # the archive does not exist yet
            pass
        time.sleep(0.2)
    raise AssertionError("the run made no progress")
