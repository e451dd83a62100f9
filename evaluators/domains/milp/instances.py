"""MILP instance generators (Gasse et al. 2019), written with numpy, cached as `.lp` files.

Four families, each at the paper's standard size plus smaller ones for quick
runs and tests and a larger one for transfer: set cover (Balas and Ho 1980),
combinatorial auctions (Leyton-Brown et al. 2000, arbitrary relationships),
capacitated facility location (Cornuejols et al. 1991) and maximum independent
set on Barabasi-Albert graphs (clique formulation). An instance is a pure
function of (family, size, seed): the same seed gives the same bytes. Files are
written atomically (temp file + `os.replace`), so evaluator actors that race
on one instance both end with a whole file.

The generators follow the learn2branch reference code with one deliberate
difference: the auctions' next-item choice uses the bundle as a boolean mask
(the reference indexes compatibility rows 0 and 1 with an integer mask).
"""
from __future__ import annotations

import os
import tempfile
import zlib
from pathlib import Path

import numpy as np

from evaluators.cache import cache_dir

FAMILIES = ("setcover", "cauctions", "facility", "indset")
SIZES: dict[str, dict[str, dict]] = {
    "setcover": {"fast": {"rows": 200, "cols": 150, "density": 0.06},
                 "small": {"rows": 250, "cols": 200, "density": 0.05},
                 # fewer columns per row than the paper's shape: trees of tens to hundreds of nodes
                 # beside a root of up to about 1.3 s (benchmarks/milp_root_share.py), so the rule shows in the time
                 "medium": {"rows": 400, "cols": 200, "density": 0.05},
                 "standard": {"rows": 500, "cols": 1000, "density": 0.05},
                 "large": {"rows": 1000, "cols": 1000, "density": 0.05}},
    "cauctions": {"fast": {"items": 30, "bids": 100}, "small": {"items": 60, "bids": 250},
                  "standard": {"items": 100, "bids": 500}, "large": {"items": 200, "bids": 1000}},
    "facility": {"fast": {"customers": 25, "facilities": 15}, "small": {"customers": 50, "facilities": 50},
                 "standard": {"customers": 100, "facilities": 100},
                 "large": {"customers": 200, "facilities": 100}},
    "indset": {"fast": {"nodes": 150, "affinity": 4}, "small": {"nodes": 300, "affinity": 4},
               "standard": {"nodes": 500, "affinity": 4}, "large": {"nodes": 1000, "affinity": 4}},
}
_VERSION = 1


def instance_path(family: str, size: str, seed: int) -> Path:
    """The cached `.lp` file of one instance, generated (atomically) on first use."""
    if family not in SIZES or size not in SIZES[family]:
        raise ValueError(f"unknown instance family/size {family}/{size}")
    path = cache_dir() / "milp" / f"v{_VERSION}" / f"{_key(family, size)}-s{seed}.lp"
    if not path.exists():
        _write_atomic(path, generate(family, size, seed))
    return path


def generate(family: str, size: str, seed: int) -> str:
    """The LP-format text of one instance; a pure function of its arguments."""
    key = zlib.crc32(_key(family, size).encode())
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(key,)))
    return _GENERATORS[family](rng, **SIZES[family][size])


def _key(family: str, size: str) -> str:
    """family-size-k1v1-k2v2: a change of the size table changes both the file and the stream."""
    return "-".join([family, size] + [f"{k}{v}" for k, v in SIZES[family][size].items()])


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


# -- LP text ------------------------------------------------------------------------------

def _terms(coefs, names) -> str:
    """' + 3 x1 - 2 x7 ...' with a line break every 20 terms (LP lines have a length limit)."""
    parts = []
    for k, (c, n) in enumerate(zip(coefs, names)):
        sign = "-" if c < 0 else "+"
        parts.append(("\n   " if k and k % 20 == 0 else " ") + f"{sign} {_num(abs(c))} {n}")
    return "".join(parts)


def _num(x) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _lp(sense: str, obj: tuple, rows: list[tuple], binaries: list[str], bounds: list[str] = ()) -> str:
    """rows: (coefs, names, op, rhs)."""
    out = [f"{sense}\n obj:{_terms(*obj)}\nsubject to\n"]
    out += [f" c{i}:{_terms(c, n)} {op} {_num(rhs)}\n" for i, (c, n, op, rhs) in enumerate(rows)]
    if bounds:
        out.append("bounds\n" + "".join(f" {b}\n" for b in bounds))
    out.append("binary\n" + "".join(f" {b}\n" for b in binaries) + "end\n")
    return "".join(out)


# -- set cover ----------------------------------------------------------------------------

def setcover(rng, rows: int, cols: int, density: float, max_coef: int = 100) -> str:
    """Balas-Ho set cover: every column covers >= 2 rows, every row is covered >= once."""
    nnz = int(rows * cols * density)
    indices = rng.choice(cols, size=nnz)
    indices[:2 * cols] = np.repeat(np.arange(cols), 2)
    col_rows = np.bincount(indices, minlength=cols)
    indices[:rows] = rng.permutation(rows)
    i, indptr = 0, [0]
    for n in col_rows:
        if i >= rows:
            indices[i:i + n] = rng.choice(rows, size=n, replace=False)
        elif i + n > rows:
            remaining = np.setdiff1d(np.arange(rows), indices[i:rows], assume_unique=True)
            indices[rows:i + n] = rng.choice(remaining, size=i + n - rows, replace=False)
        i += n
        indptr.append(i)
    cost = rng.integers(max_coef, size=cols) + 1
    members: list[list[int]] = [[] for _ in range(rows)]
    for j in range(cols):
        for r in sorted(set(indices[indptr[j]:indptr[j + 1]].tolist())):
            members[r].append(j)
    names = [f"x{j}" for j in range(cols)]
    cons = [([1] * len(m), [names[j] for j in m], ">=", 1) for m in members]
    return _lp("minimize", (cost, names), cons, names)


# -- combinatorial auctions ---------------------------------------------------------------

def _next_item(mask, interests, compats, rng) -> int:
    prob = (1 - mask) * interests * compats[mask.astype(bool), :].mean(axis=0)
    return int(rng.choice(len(interests), p=prob / prob.sum()))


def _bundle(first: int, interests, compats, rng, size: int | None = None, grow_prob: float = 0.0) -> np.ndarray:
    """Items of a bundle grown from `first`: to `size` items, or while a coin of `grow_prob` says so."""
    mask = np.zeros(len(interests))
    mask[first] = 1
    while (mask.sum() < size) if size is not None else (rng.random() < grow_prob and mask.sum() < len(mask)):
        mask[_next_item(mask, interests, compats, rng)] = 1
    return np.nonzero(mask)[0]


def _bidder(rng, values, compats, max_value, room, dev=0.5, add_prob=0.9, max_sub=5, additivity=0.2,
            budget_factor=1.5, resale_factor=0.5) -> dict:
    """One bidder's substitutable (XOR) bids: bundle -> price; empty if the first price < 0."""
    n = len(values)
    interests = rng.random(n)
    private = values + max_value * dev * (2 * interests - 1)
    first = int(rng.choice(n, p=interests / interests.sum()))
    bundle = _bundle(first, interests, compats, rng, grow_prob=add_prob)
    price = private[bundle].sum() + len(bundle) ** (1 + additivity)
    if price < 0:
        return {}
    bids = {frozenset(bundle.tolist()): price}
    subs = []
    for item in bundle:
        sub = _bundle(int(item), interests, compats, rng, size=len(bundle))
        subs.append((sub, private[sub].sum() + len(sub) ** (1 + additivity)))
    budget, min_resale = budget_factor * price, resale_factor * values[bundle].sum()
    for sub, sub_price in [subs[k] for k in np.argsort([-p for _, p in subs], kind="stable")]:
        if len(bids) >= max_sub + 1 or len(bids) >= room:
            break
        key = frozenset(sub.tolist())
        if 0 <= sub_price <= budget and values[sub].sum() >= min_resale and key not in bids:
            bids[key] = sub_price
    return bids


def cauctions(rng, items: int, bids: int, min_value: float = 1, max_value: float = 100) -> str:
    """Arbitrary-relationships auctions: maximize revenue, each item sold at most once."""
    values = min_value + (max_value - min_value) * rng.random(items)
    compats = np.triu(rng.random((items, items)), k=1)
    compats = compats + compats.T
    compats = compats / compats.sum(axis=1)
    placed, dummies = [], 0
    while len(placed) < bids:
        offer = _bidder(rng, values, compats, max_value, bids - len(placed))
        extra = [items + dummies] if len(offer) > 2 else []
        dummies += bool(extra)
        placed += [(sorted(b) + extra, p) for b, p in offer.items()]
    names = [f"x{k}" for k in range(len(placed))]
    holders: list[list[int]] = [[] for _ in range(items + dummies)]
    for k, (bundle, _) in enumerate(placed):
        for item in bundle:
            holders[item].append(k)
    cons = [([1] * len(h), [names[k] for k in h], "<=", 1) for h in holders if h]
    prices = [round(float(p), 6) for _, p in placed]
    return _lp("maximize", (prices, names), cons, names)


# -- capacitated facility location ----------------------------------------------------------

def facility(rng, customers: int, facilities: int, ratio: float = 5.0) -> str:
    """Cornuejols et al.: open facilities (binary y) and serve every customer's demand (x)."""
    cx, cy, fx, fy = (rng.random(n) for n in (customers, customers, facilities, facilities))
    demand = rng.integers(5, 36, size=customers)
    capacity = rng.integers(10, 161, size=facilities)
    fixed = (rng.integers(100, 111, size=facilities) * np.sqrt(capacity)
             + rng.integers(91, size=facilities)).astype(int)
    capacity = (capacity * ratio * demand.sum() / capacity.sum()).astype(int)
    trans = np.sqrt((cx[:, None] - fx[None, :]) ** 2 + (cy[:, None] - fy[None, :]) ** 2) * 10 * demand[:, None]
    x = [[f"x{i}_{j}" for j in range(facilities)] for i in range(customers)]
    y = [f"y{j}" for j in range(facilities)]
    obj = (list(fixed) + [round(float(v), 6) for v in trans.ravel()], y + [n for row in x for n in row])
    cons = [([-1] * facilities, x[i], "<=", -1) for i in range(customers)]
    cons += [(list(demand) + [-int(capacity[j])], [x[i][j] for i in range(customers)] + [y[j]], "<=", 0)
             for j in range(facilities)]
    cons.append(([-int(c) for c in capacity], y, "<=", -int(demand.sum())))
    cons += [([1, -1], [x[i][j], y[j]], "<=", 0) for i in range(customers) for j in range(facilities)]
    bounds = [f"0 <= {n} <= 1" for row in x for n in row]
    return _lp("minimize", obj, cons, y, bounds)


# -- maximum independent set ----------------------------------------------------------------

def barabasi_albert(rng, nodes: int, affinity: int) -> list[set[int]]:
    """Neighbour sets of a Barabasi-Albert graph (the first new node joins all before it)."""
    neighbours = [set() for _ in range(nodes)]
    degrees = np.zeros(nodes, dtype=np.int64)
    edges = 0
    for new in range(affinity, nodes):
        if new == affinity:
            chosen = np.arange(new)
        else:
            chosen = rng.choice(new, affinity, replace=False, p=degrees[:new] / (2 * edges))
        for node in chosen.tolist():
            neighbours[node].add(new)
            neighbours[new].add(node)
            degrees[[node, new]] += 1
            edges += 1
    return neighbours


def _clique_partition(neighbours: list[set[int]]) -> list[list[int]]:
    degrees = np.array([len(n) for n in neighbours])
    left = [int(v) for v in np.argsort(-degrees, kind="stable")]
    cliques = []
    while left:
        centre, rest = left[0], set(left[1:])
        clique = [centre]
        for v in sorted(neighbours[centre] & rest, key=lambda v: (-degrees[v], v)):
            if all(v in neighbours[u] for u in clique):
                clique.append(v)
        cliques.append(sorted(clique))
        members = set(clique)
        left = [v for v in left if v not in members]
    return cliques


def indset(rng, nodes: int, affinity: int) -> str:
    """Maximum independent set: one inequality per greedy clique, one per edge left over."""
    neighbours = barabasi_albert(rng, nodes, affinity)
    groups = {(u, v) for u in range(nodes) for v in neighbours[u] if u < v}
    for clique in _clique_partition(neighbours):
        groups -= {(u, v) for k, u in enumerate(clique) for v in clique[k + 1:]}
        if len(clique) > 1:
            groups.add(tuple(clique))
    used = {v for g in groups for v in g}
    groups |= {(v,) for v in range(nodes) if v not in used}
    names = [f"x{v}" for v in range(nodes)]
    cons = [([1] * len(g), [names[v] for v in g], "<=", 1) for g in sorted(groups)]
    return _lp("maximize", ([1] * nodes, names), cons, names)


_GENERATORS = {"setcover": setcover, "cauctions": cauctions, "facility": facility, "indset": indset}
