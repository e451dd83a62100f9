"""The compact hash maps behave like the dict and set they replace, across merges."""
import numpy as np

import store.hash_index as hash_index
from store.hash_index import HashIndex, HashSet, id_hash


def test_index_finds_updates_and_adds_across_merges(monkeypatch):
    monkeypatch.setattr(hash_index, "_MERGE_AT", 8)  # merge often
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 2**64, 50, dtype=np.uint64)
    index = HashIndex(keys, np.arange(50), np.zeros(50))
    truth = {int(k): (i, 0.0) for i, k in enumerate(keys)}
    for i, key in enumerate(rng.integers(0, 2**64, 100, dtype=np.uint64).tolist()):
        if i % 3:
            index.add_new({key: (1000 + i, float(i))})
        else:
            index.put(key, 1000 + i, float(i))
        truth[key] = (1000 + i, float(i))
    for key in list(truth)[::7]:
        index.put(key, -1, 0.5)
        truth[key] = (-1, 0.5)
    probes = list(truth) + [5, 2**64 - 1]
    assert index.get_many(probes) == [truth.get(k) for k in probes]
    assert [index.get(k) for k in probes] == [truth.get(k) for k in probes]
    assert len(index) == len(truth) and sorted(index.keys()) == sorted(truth)


def test_hash_set_is_a_set_of_hex_hashes():
    hashes = HashSet(np.array([0xAB, 0xAB, 0xFFFF_FFFF_FFFF_FFFF], dtype=np.uint64))
    assert len(hashes) == 2 and "00000000000000ab" in hashes and "ffffffffffffffff" in hashes
    hashes.add("0123456789abcdef")
    assert "0123456789abcdef" in hashes and "not-a-hash" not in hashes and "ab" not in hashes
    assert {"00000000000000ab"} <= hashes and set(hashes) == {"00000000000000ab", "ffffffffffffffff",
                                                             "0123456789abcdef"}


def test_id_hash_matches_the_sql_the_archive_stores():
    import duckdb

    ids = ["a", "7f3e9c01b2d4", "baseline-optimized base-stock-run"]
    sql = duckdb.connect().execute("SELECT ('0x' || md5(x)[1:16])::UBIGINT FROM unnest(?) t(x)", [ids]).fetchall()
    assert [id_hash(i) for i in ids] == [v for (v,) in sql]
